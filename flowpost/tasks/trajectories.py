"""Node ``acquire.<dataset>`` of a ``teacher-trajectories`` source: sample a finished stage's ODE
once and cache its states at a few-step student's sigmas as shards.

Record ``t<index>`` rolls out prompt ``index % len(prompts)`` from the noise addressed by (seed,
``trajectories-<dataset>``, 0, index); its ``image`` is the states at the ``steps + 1`` sigmas
(the last one the teacher's endpoint) stacked along the channels, in the model's latent space.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.config.schema.sampled import TrajectoriesConfig
from flowpost.core.io import read_json, write_json_atomic
from flowpost.core.logging import get_logger
from flowpost.core.models.registry import load_adapter
from flowpost.core.noise import addressed_randn
from flowpost.core.sampling.substeps import ode_states
from flowpost.data.condition_cache import load_conditions
from flowpost.data.records import Demonstration
from flowpost.data.shards import write_shards
from flowpost.data.stage_inputs import PROMPTS_FILE, read_prompt_set

log = get_logger(__name__)
SMOKE_TRAJECTORIES = 16


def prompt_pool(dataset_dir: Path) -> list[tuple[str, int | None]]:
    """(prompt, label) of a dataset's training prompts, sorted: a prompt set's or a demonstration set's."""
    if (dataset_dir / PROMPTS_FILE).is_file():
        rows = read_prompt_set(dataset_dir)
        return sorted((prompt, meta.get("label")) for prompt, meta in rows)
    manifest = read_json(dataset_dir / "train" / "manifest.json", what="dataset manifest")
    labels = manifest.get("labels") or {prompt: None for prompt in manifest["prompts"]}
    return [(prompt, labels[prompt]) for prompt in sorted(labels)]


@torch.no_grad()
def acquire_trajectories(
    config: TrajectoriesConfig,
    out_dir: Path,
    *,
    dataset: str,
    weights_dir: Path,
    prompts_dir: Path,
    conditions_dir: Path,
    encoder_fingerprint: str,
    seed: int,
    smoke: bool = False,
) -> dict[str, Any]:
    """Write ``train/`` shards of teacher trajectories and ``manifest.json``; return the manifest."""
    adapter = load_adapter(weights_dir)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    adapter.module().to(device).eval()
    pool = prompt_pool(prompts_dir)
    count = min(config.samples, SMOKE_TRAJECTORIES) if smoke else config.samples
    sigmas = adapter.inference_sigmas(config.steps)
    prompts = [pool[i % len(pool)][0] for i in range(count)]
    conditions = load_conditions(conditions_dir, sorted(set(prompts)), encoder_fingerprint=encoder_fingerprint)
    rows = {prompt: row for row, prompt in enumerate(sorted(set(prompts)))}
    negative = load_conditions(conditions_dir, [NULL_PROMPT], encoder_fingerprint=encoder_fingerprint)
    records: list[Demonstration] = []
    for start in range(0, count, config.batch_size):
        indices = list(range(start, min(start + config.batch_size, count)))
        noise = addressed_randn(
            adapter.latent_shape, seed=seed, stage=f"trajectories-{dataset}", step=0, indices=indices
        ).to(device)
        state = adapter.prepare_condition_state(conditions.index([rows[prompts[i]] for i in indices]).to(device))
        neg = None
        if config.guidance != 1.0:
            neg = adapter.prepare_condition_state(negative.index([0] * len(indices)).to(device))
        states = ode_states(
            adapter, noise, state, sigmas, substeps=config.substeps, guidance=config.guidance, negative=neg
        )
        stacked = states.flatten(1, 2).float().cpu().numpy()
        for offset, index in enumerate(indices):
            prompt, label = pool[index % len(pool)]
            records.append(
                Demonstration(key=f"t{index:06d}", prompt=prompt, image=stacked[offset], label=label, metadata={})
            )
    trajectory = {
        "stage": config.stage,
        "weights": weights_dir.name,
        "sigmas": [float(s) for s in sigmas],
        "substeps": config.substeps,
        "guidance": config.guidance,
        "latent_shape": list(adapter.latent_shape),
    }
    shards = write_shards(records, out_dir / "train")
    write_json_atomic(out_dir / "train" / "manifest.json", {**shards, "trajectory": trajectory})
    manifest = {
        "source": "teacher-trajectories",
        "counts": {"train": shards["count"]},
        "shards": {"train": shards["shards"]},
        "train_prompts": shards["prompts"],
        "eval_prompts": [],
        "trajectory": trajectory,
        "smoke": smoke,
    }
    write_json_atomic(out_dir / "manifest.json", manifest)
    log.info("sampled %d teacher trajectories of %s at %d steps", count, config.stage, config.steps)
    return manifest
