"""Node ``acquire.<dataset>`` of a ``sampled-pairs`` dataset: preference pairs from a trained stage's samples.

Each round draws ``candidates`` samples per prompt from the stage's weights (20-step ODE from noise
addressed by (seed, node, global sample index): the same pairs on every run), scores them with the
configured rewards and keeps the best against the worst of every group whose reward gap reaches
``min_gap``. The pairs are written as preference-pair shards under ``train/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.config.schema.rewards import RewardConfig
from flowpost.core.config.schema.sampled import SampledPairsConfig
from flowpost.core.io import write_json_atomic
from flowpost.core.logging import get_logger
from flowpost.core.models.registry import load_adapter
from flowpost.core.rewards.combine import WeightedRewards
from flowpost.core.rewards.registry import build_reward, reward_parameters
from flowpost.core.sampling.generate import generate_images
from flowpost.core.trainers.preference import group_pairs
from flowpost.data.condition_cache import load_conditions
from flowpost.data.records import PreferencePair
from flowpost.data.shards import write_shards
from flowpost.data.stage_inputs import prompt_pool
from flowpost.errors import FlowpostError
from flowpost.tasks.weights import stage_weights

log = get_logger(__name__)


def sample_pairs(
    config: SampledPairsConfig,
    *,
    dataset: str,
    stage_dir: Path,
    prompts_dir: Path,
    conditions_dir: Path,
    encoder_fingerprint: str,
    out_dir: Path,
    seed: int,
    smoke: bool = False,
) -> dict[str, Any]:
    """Write ``train/`` shards of the pairs and ``manifest.json``; return the manifest. ``smoke`` runs one round."""
    where = f"datasets.{dataset}.sample"
    rewards = _rewards(config.rewards, assets_dir=prompts_dir / "assets", where=f"{where}.rewards")  # fail early
    weights_dir, weights = stage_weights(stage_dir, config.weights)
    adapter = load_adapter(weights_dir)
    rounds = 1 if smoke else config.rounds
    groups = [(prompt, meta) for _ in range(rounds) for prompt, meta in prompt_pool(prompts_dir)]
    prompts = [prompt for prompt, _ in groups for _ in range(config.candidates)]
    metadata = [meta for _, meta in groups for _ in range(config.candidates)]
    conditions = load_conditions(conditions_dir, prompts, encoder_fingerprint=encoder_fingerprint)
    negative = (
        load_conditions(conditions_dir, [NULL_PROMPT], encoder_fingerprint=encoder_fingerprint)
        if config.guidance != 1.0
        else None
    )
    images = generate_images(
        adapter,
        conditions,
        negative,
        indices=range(len(prompts)),
        seed=seed,
        stage=f"acquire.{dataset}",
        steps=config.steps,
        guidance=config.guidance,
        batch_size=config.batch_size,
    )
    scores = _scores(rewards, images, prompts, metadata, batch_size=config.batch_size)
    group_ids = torch.arange(len(groups)).repeat_interleave(config.candidates)
    chosen, rejected, valid = group_pairs(scores, group_ids)
    gaps = scores[chosen] - scores[rejected]
    kept = [g for g in range(len(groups)) if bool(valid[g]) and float(gaps[g]) >= config.min_gap]
    if not kept:
        raise FlowpostError(
            f"no group of {config.candidates} samples has a reward gap of at least {config.min_gap}; "
            "lower min_gap or raise candidates",
            where=f"{where}.min_gap",
        )
    records = [_pair(g, groups[g], images, scores, chosen[g], rejected[g], config.candidates) for g in kept]
    shards = write_shards(records, out_dir / "train")
    write_json_atomic(out_dir / "train" / "manifest.json", shards)
    manifest = {
        "source": "sampled-pairs",
        "stage": config.stage,
        "weights": weights,
        "counts": {"train": len(records), "eval": 0, "skipped_groups": len(groups) - len(kept)},
        "rewards": {
            "chosen_mean": float(scores[[chosen[g] for g in kept]].mean()),
            "rejected_mean": float(scores[[rejected[g] for g in kept]].mean()),
            "gap_mean": float(gaps[kept].mean()),
        },
        "shards": {"train": shards["shards"]},
        "train_prompts": shards["prompts"],
        "eval_prompts": [],
        "smoke": smoke,
    }
    write_json_atomic(out_dir / "manifest.json", manifest)
    log.info("sampled %d pairs from stage %s: %s", len(records), config.stage, manifest["rewards"])
    return manifest


def _scores(
    rewards: WeightedRewards,
    images: torch.Tensor,
    prompts: list[str],
    metadata: list[dict[str, Any]],
    *,
    batch_size: int,
) -> torch.Tensor:
    """The weighted reward [N] of every sample, scored ``batch_size`` at a time, on the CPU."""
    chunks = [
        rewards(images[i : i + batch_size], prompts[i : i + batch_size], metadata[i : i + batch_size]).total
        for i in range(0, len(prompts), batch_size)
    ]
    return torch.cat(chunks).cpu()


def _rewards(configs: list[RewardConfig], *, assets_dir: Path, where: str) -> WeightedRewards:
    """The weighted ranking reward; scorers that take ``assets_dir`` get the prompt dataset's assets."""
    components = []
    for i, config in enumerate(configs):
        options = dict(config.options)
        if "assets_dir" in reward_parameters(config.name, where=f"{where}.{i}.name"):
            options.setdefault("assets_dir", assets_dir)
        components.append((build_reward(config.name, options=options, where=f"{where}.{i}"), config.weight))
    return WeightedRewards(components, where=where)


def _pair(
    group: int,
    prompt: tuple[str, dict[str, Any]],
    images: torch.Tensor,
    scores: torch.Tensor,
    chosen: int,
    rejected: int,
    candidates: int,
) -> PreferencePair:
    text, meta = prompt
    label = meta.get("label")
    return PreferencePair(
        key=f"pair-{group:06d}",
        prompt=text,
        chosen=images[chosen].numpy(),
        rejected=images[rejected].numpy(),
        label=label if isinstance(label, int) else None,
        metadata={
            **meta,
            "chosen_reward": float(scores[chosen]),
            "rejected_reward": float(scores[rejected]),
            "chosen_candidate": chosen - group * candidates,
            "rejected_candidate": rejected - group * candidates,
        },
    )
