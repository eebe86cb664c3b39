"""Node ``eval.<stage>``: sample held-out prompts from a stage's weights and score them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.config.schema import EvaluateConfig
from flowpost.core.evaluation.classifier import JUDGE_CLASSIFIER, REWARD_CLASSIFIER, load_classifier
from flowpost.core.evaluation.digits import EvalPlan, digit_metrics, generate
from flowpost.core.evaluation.grid import save_grid
from flowpost.core.io import read_json, write_json_atomic
from flowpost.core.models.registry import load_adapter
from flowpost.data.condition_cache import load_conditions
from flowpost.data.shards import read_shards
from flowpost.tasks.weights import stage_weights

SMOKE_SAMPLES = 20
GRID_COLUMNS = 10  # one row per digit


def evaluate_stage(
    config: EvaluateConfig,
    *,
    stage: str,
    train_dir: Path,
    dataset_dir: Path,
    conditions_dir: Path,
    encoder_fingerprint: str,
    out_dir: Path,
    seed: int,
    smoke: bool = False,
) -> dict[str, Any]:
    """Write ``metrics.json`` and ``grid.png`` for one stage; return the metrics."""
    weights_dir, weights = stage_weights(train_dir, config.weights)
    adapter = load_adapter(weights_dir)
    manifest = read_json(dataset_dir / "manifest.json", what="dataset manifest")
    plan = EvalPlan(
        prompts=[e["prompt"] for e in manifest["eval_prompts"]],
        labels=[int(e["label"]) for e in manifest["eval_prompts"]],
        samples=min(config.samples, SMOKE_SAMPLES) if smoke else config.samples,
        steps=config.steps,
        guidance=config.guidance,
        seed=config.seed,
        batch_size=config.batch_size,
    )
    conditions = load_conditions(conditions_dir, plan.prompts, encoder_fingerprint=encoder_fingerprint)
    negative = load_conditions(conditions_dir, [NULL_PROMPT], encoder_fingerprint=encoder_fingerprint)
    images = generate(adapter, plan, conditions, negative)
    labels = torch.tensor([plan.labels[r] for r in plan.rows()])

    test_dir = dataset_dir / "test"
    real = read_shards(test_dir, read_json(test_dir / "manifest.json", what="test manifest"))
    seen: set[int] = set()
    real_images = []
    for record in real:  # each held-out image appears once per template: use it once
        if record.metadata["index"] not in seen:
            seen.add(record.metadata["index"])
            real_images.append(torch.from_numpy(record.image))
    assets = dataset_dir / "assets"
    metrics = digit_metrics(
        images,
        labels,
        judge=load_classifier(assets, JUDGE_CLASSIFIER.name),
        reward=load_classifier(assets, REWARD_CLASSIFIER.name),
        real_images=torch.stack(real_images),
    )
    metrics |= {
        "weights": weights,
        "seed": seed,
        "eval_seed": config.seed,
        "smoke": smoke,
        "steps": config.steps,
        "guidance": config.guidance,
        "stage": stage,
    }
    progress = read_json(train_dir / "final" / "progress.json", what="stage progress")
    metrics["step"] = int(progress["optimizer_step"])
    per_digit = [[i for i in range(len(labels)) if int(labels[i]) == d][:GRID_COLUMNS] for d in range(10)]
    save_grid(images[[i for row in per_digit for i in row]], out_dir / "grid.png", nrow=GRID_COLUMNS)
    metrics["grid"] = str(out_dir / "grid.png")
    write_json_atomic(out_dir / "metrics.json", metrics)
    return metrics
