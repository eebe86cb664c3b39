"""The default pipeline's data and condition cache in a bench workspace, and stage specs on them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict, validate_pipeline
from flowpost.core.config.schema import PipelineConfig, StageConfig
from flowpost.core.events import read_events
from flowpost.core.trainers.spec import StageSpec
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.runner import PipelineRun
from flowpost.tasks.train import stage_spec

UPSTREAM = ("acquire.digits", "conditions.minilm")


def bench_pipeline(budgets: dict[str, int], overrides: list[str] | None = None) -> PipelineConfig:
    """The default pipeline (with dotted ``overrides``, e.g. smaller batches) with each named stage from
    scratch for ``budgets[stage]`` units, one event per unit, no checkpoints or trackers."""
    data = pipeline_to_dict(load_pipeline(None, overrides))
    for name, budget in budgets.items():
        stage = data["stages"][name]
        key = "max_steps" if name == "sft" else "iterations"
        stage["model"] = {**stage["model"], "init": "scratch"}
        stage["train"] = {**stage["train"], key: budget, "checkpoint_every": 0, "log_every": 1}
        stage["callbacks"] = {**stage["callbacks"], "trackers": []}
    return validate_pipeline(data, source="bench pipeline")


def prepared_run(workspace: Path, pipeline: PipelineConfig) -> PipelineRun:
    """A run whose dataset and condition cache are built (or reused) under ``workspace``."""
    run = PipelineRun(pipeline, workspace)
    for node in UPSTREAM:
        run.execute(node)
    return run


def fresh_spec(run: PipelineRun, name: str, out: Path) -> StageSpec:
    """Stage ``name`` of ``run`` writing into an emptied ``out``, never resuming."""
    return spec_on(
        run.pipeline, name, out, dataset=run.path("acquire.digits"), conditions=run.path("conditions.minilm")
    )


def spec_on(pipeline: PipelineConfig, name: str, out: Path, *, dataset: Path, conditions: Path) -> StageSpec:
    """Stage ``name`` of ``pipeline`` on the ``dataset`` and ``conditions`` folders, writing into an emptied
    ``out``, never resuming."""
    shutil.rmtree(out, ignore_errors=True)
    return stage_spec(
        pipeline,
        name,
        out,
        dataset_dir=dataset,
        conditions_dir=conditions,
        encoder_fingerprint=encoder_fingerprint(conditions),
        init_from=None,
        resume=False,
    )


def unit_seconds(events_path: Path) -> list[float]:
    """Seconds between consecutive step events (the first unit, with its warm-up, is left out)."""
    times = [float(e["time"]) for e in read_events(events_path) if e["event"] == "progress"]
    return [later - earlier for earlier, later in zip(times, times[1:], strict=False)]


def stage_train(pipeline: PipelineConfig, name: str) -> dict[str, Any]:
    """The validated ``train:`` section of stage ``name``."""
    return pipeline.stages[name].train


def folder_stage_spec(
    stage: StageConfig, root: Path, out: Path, *, name: str, fingerprint: str, latents: bool = False, seed: int = 0
) -> StageSpec:
    """Stage ``name`` (from scratch) on ``root``'s ``data``, ``conditions`` (filled by the encoder
    ``fingerprint``) and, with ``latents``, ``latents`` folders, writing an emptied ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    return StageSpec(
        stage=name,
        seed=seed,
        config=stage.model_dump(mode="json"),
        output_dir=str(out),
        dataset_dir=str(root / "data"),
        conditions_dir=str(root / "conditions"),
        latents_dir=str(root / "latents") if latents else None,
        encoder_fingerprint=fingerprint,
        resume=False,
    )
