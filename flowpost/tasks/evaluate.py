"""Node ``eval.<stage>``: sample a dataset's held-out prompts (every prompt of a prompt-files dataset: test
prompts kept apart from the training ones) from a stage's weights and score them with the configured metrics,
once per noise seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.config.schema.evaluation import EvaluateConfig
from flowpost.core.config.schema.rewards import RewardConfig
from flowpost.core.evaluation.grid import save_grid
from flowpost.core.evaluation.intervals import summarize
from flowpost.core.evaluation.paired import Scores, compare_with_base, per_category, sample_category
from flowpost.core.evaluation.plan import EvalPlan, generate
from flowpost.core.evaluation.registry import build_metric, metric_metadata_fields
from flowpost.core.evaluation.samples import EvalSamples, Metric
from flowpost.core.io import read_json, write_json_atomic
from flowpost.core.models.base import ModelAdapter
from flowpost.core.models.registry import load_adapter
from flowpost.core.rewards.metadata_fields import check_metadata_fields
from flowpost.data.condition_cache import load_conditions
from flowpost.data.eval_split import EvalSplit, read_eval_split
from flowpost.data.stage_inputs import read_prompt_set
from flowpost.tasks.curve import Counter, checkpoint_curve, due_checkpoints, write_curve
from flowpost.tasks.weights import stage_weights

SMOKE_SAMPLES = 20
GRID_SIDE = 10  # at most 10 rows (one per digit, or per prompt) of 10 samples
TRAINED_REWARD = "trained_reward"  # the stage's own weighted reward sum on the evaluation samples
GAP = "reward_judge_gap"  # trained_reward minus the headline metric


def evaluate_stage(
    config: EvaluateConfig,
    *,
    stage: str,
    rewards: list[RewardConfig],
    train_dir: Path,
    dataset_dir: Path,
    conditions_dir: Path,
    encoder_fingerprint: str,
    out_dir: Path,
    seed: int,
    smoke: bool = False,
    counter: Counter = "optimizer_step",
    base: ModelAdapter | None = None,
) -> dict[str, Any]:
    """Write ``metrics.json`` and ``grid.png`` for one stage; return the metrics.

    Each metric's value is its mean over the seeds; with several seeds ``intervals`` holds its 95 %
    interval and ``per_seed`` the values of each. A stage trained on ``rewards`` also gets their
    weighted sum on the samples (``trained_reward``) and its gap to the headline metric. With
    ``evaluate.every`` the checkpoints at its multiples of ``counter`` are scored too, into ``curve.json``.
    A metric scored sample by sample (a reward) on prompts with a category (``category``, ``tag``) gets its
    mean per category (``per_category``). With a ``base`` model (``evaluate.compare_to_base``) the same
    samples are drawn from it: ``base`` holds its values, ``vs_base`` each difference and its interval.
    """
    assert config.metrics is not None  # the schema fills in or requires them
    weights_dir, weights = stage_weights(train_dir, config.weights)
    adapter = load_adapter(weights_dir)
    split = evaluation_prompts(dataset_dir)
    assets = dataset_dir / "assets" if (dataset_dir / "assets").is_dir() else None
    check_evaluated_metadata(config, stage=stage, rewards=rewards, split=split, dataset=config.dataset or dataset_dir)
    metrics: dict[str, Metric] = {
        metric.result_key: build_metric(
            metric.name, options=metric.options, where=f"evaluate.metrics.{i}", assets_dir=assets
        )
        for i, metric in enumerate(config.metrics)
    }
    trained = [
        (build_metric(r.name, options=r.options, where=f"stages.{stage}.rewards.{i}", assets_dir=assets), r.weight)
        for i, r in enumerate(rewards)
    ]
    conditions = load_conditions(conditions_dir, split.prompts, encoder_fingerprint=encoder_fingerprint)
    negative = load_conditions(conditions_dir, [NULL_PROMPT], encoder_fingerprint=encoder_fingerprint)
    samples_per_seed = min(config.samples, SMOKE_SAMPLES) if smoke else config.samples

    def score(model: ModelAdapter, grid: Path | None = None) -> Scores:
        """One row per noise seed: each metric (and the trained reward) on ``model``'s samples; the scores of
        each sample of the metrics that score samples one by one."""
        per_seed: list[dict[str, Any]] = []
        per_sample: dict[str, list[float]] = {}
        categories: list[str | None] = []
        for noise_seed in config.noise_seeds():
            plan = EvalPlan(
                prompts=split.prompts,
                samples=samples_per_seed,
                steps=config.steps,
                guidance=config.guidance,
                seed=noise_seed,
                batch_size=config.batch_size,
            )
            rows = plan.rows()
            samples = EvalSamples(
                images=generate(model, plan, conditions, negative),
                prompts=[split.prompts[r] for r in rows],
                metadata=[split.metadata[r] for r in rows],
                reference=split.reference,
            )
            values, each = _values(samples, metrics, trained)
            for key, scores in each.items():
                per_sample.setdefault(key, []).extend(scores)
            categories += [sample_category(meta) for meta in samples.metadata]
            per_seed.append({"seed": noise_seed, **values})
            if grid is not None and len(per_seed) == 1:
                shown, columns = _grid(samples)
                save_grid(samples.images[shown], grid, nrow=columns)
        return Scores(per_seed, per_sample, categories)

    headline = config.metrics[0].result_key
    scored = score(adapter, out_dir / "grid.png")
    per_seed = scored.per_seed
    result = _summary(per_seed, headline=headline)
    final = _means(result)  # the curve's last row
    if by_category := per_category(scored):
        result["per_category"] = by_category
    if base is not None:
        comparison = compare_with_base(scored, score(base))
        result["base"] = {key: entry.pop("base") for key, entry in comparison.items()}
        result["vs_base"] = comparison
    progress = read_json(train_dir / "final" / "progress.json", what="stage progress")
    result |= {
        "metrics": list(metrics),
        "headline": headline,
        "n_samples": samples_per_seed * len(per_seed),
        "samples_per_seed": samples_per_seed,
        "weights": weights,
        "seed": seed,
        "eval_seed": per_seed[0]["seed"],
        "eval_seeds": [row["seed"] for row in per_seed],
        "smoke": smoke,
        "steps": config.steps,
        "guidance": config.guidance,
        "stage": stage,
        "step": int(progress["optimizer_step"]),
        "grid": str(out_dir / "grid.png"),
    }
    if config.every is not None:
        due = due_checkpoints(train_dir / "checkpoints", every=config.every, counter=counter, smoke=smoke)
        curve = checkpoint_curve(
            adapter,
            due,
            weights=weights,
            final={"step": result["step"], **final},
            score=lambda model: _means(_summary(score(model).per_seed, headline=headline)),
        )
        result["curve"] = str(write_curve(out_dir, curve))
    write_json_atomic(out_dir / "metrics.json", result)
    return result


def check_evaluated_metadata(
    config: EvaluateConfig, *, stage: str, rewards: list[RewardConfig], split: EvalSplit, dataset: str | Path
) -> None:
    """Refuse evaluation prompts without a metadata field that a metric, or a reward the stage trained on,
    reads; the error names the entry, the dataset, the prompt and the field."""
    rows = list(zip(split.prompts, split.metadata, strict=True))
    scored = [(metric.name, f"evaluate.metrics.{i}") for i, metric in enumerate(config.metrics or [])]
    for name, where in scored + [(r.name, f"stages.{stage}.rewards.{i}") for i, r in enumerate(rewards)]:
        fields = metric_metadata_fields(name, where=where)
        check_metadata_fields(name, fields, rows, dataset=str(dataset), where=where)


def evaluation_prompts(dataset_dir: Path) -> EvalSplit:
    """The prompts to evaluate on: all of a prompt-files dataset (the schema keeps it out of training), else the
    dataset's held-out split with its real images."""
    manifest = read_json(dataset_dir / "manifest.json", what="dataset manifest")
    if manifest.get("source") != "prompt-files":
        return read_eval_split(dataset_dir, where="evaluate.dataset")
    pairs = read_prompt_set(dataset_dir)
    return EvalSplit([prompt for prompt, _ in pairs], [metadata for _, metadata in pairs], None)


def _values(
    samples: EvalSamples, metrics: dict[str, Metric], trained: list[tuple[Metric, float]]
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each metric's value (and the trained reward's) on ``samples``, and the scores of each sample of those
    that score samples one by one (rewards; the trained reward when all its terms do)."""
    values: dict[str, float] = {}
    each: dict[str, list[float]] = {}
    for key, metric in metrics.items():
        if (per_sample := _sample_scores(metric, samples)) is not None:
            values[key], each[key] = float(per_sample.mean()), per_sample.tolist()
        else:
            values[key] = metric(samples)
    if trained:
        terms = [(weight, _sample_scores(metric, samples), metric) for metric, weight in trained]
        values[TRAINED_REWARD] = sum(w * (float(s.mean()) if s is not None else m(samples)) for w, s, m in terms)
        if all(s is not None for _, s, _ in terms):
            each[TRAINED_REWARD] = sum(w * s.double() for w, s, _ in terms).tolist()
    return values, each


def _sample_scores(metric: Metric, samples: EvalSamples) -> Tensor | None:
    """The metric's score of each sample, or None for a metric that scores the set as a whole."""
    scores = getattr(metric, "scores", None)
    return scores(samples) if callable(scores) else None


def _means(summary: dict[str, Any]) -> dict[str, float]:
    """A summary's mean values alone (no intervals, no per-seed rows)."""
    return {key: value for key, value in summary.items() if key not in ("intervals", "per_seed")}


def _summary(per_seed: list[dict[str, Any]], *, headline: str) -> dict[str, Any]:
    """Each value's mean over the seeds; with several seeds its interval and the rows; the reward-judge gap."""
    keys = [key for key in per_seed[0] if key != "seed"]
    summaries = {key: summarize([float(row[key]) for row in per_seed]) for key in keys}
    result: dict[str, Any] = {key: s.mean for key, s in summaries.items()}
    if TRAINED_REWARD in result:
        result[GAP] = result[TRAINED_REWARD] - result[headline]
    if len(per_seed) > 1:
        result["intervals"] = {key: [s.low, s.high] for key, s in summaries.items()}
        result["per_seed"] = per_seed
    return result


def _grid(samples: EvalSamples) -> tuple[list[int], int]:
    """The grid's sample indices row by row, and its column count: one row per digit label when every
    prompt has one, else per prompt; at most 10 rows of the same number (at most 10) of samples."""
    labels = [meta.get("label") for meta in samples.metadata]
    if all(label is not None for label in labels):
        groups = [[i for i, label in enumerate(labels) if label == value] for value in sorted(set(labels))]
    else:
        groups = samples.groups()
    groups = groups[:GRID_SIDE]
    columns = min(GRID_SIDE, *(len(group) for group in groups))
    return [i for group in groups for i in group[:columns]], columns
