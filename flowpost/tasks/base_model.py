"""A stage's base model: what the first stage of its ``model.init`` chain starts from (``init: previous``
follows its ``fallback``, so the base stays put while promoted exports change)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowpost.core.config.schema.pipeline import PipelineConfig

if TYPE_CHECKING:
    from flowpost.core.models.base import ModelAdapter

# the model fields that make a base model (those at their default are left out of a model's dump)
BASE_FIELDS = (
    "family",
    "pretrained",
    "revision",
    "variant",
    "torch_dtype",
    "components",
    "options",
    "shift",
    "transformer",
)


def base_stage(pipeline: PipelineConfig, stage: str) -> str:
    """The first stage of ``stage``'s init chain: the one that starts from no stage."""
    seen = [stage]
    while True:
        model = pipeline.stages[seen[-1]].model
        start = model.fallback if model.init == "previous" else model.init
        if start == "scratch":
            return seen[-1]
        seen.append(start)


def base_params(pipeline: PipelineConfig, stage: str) -> dict[str, Any]:
    """What the base model of ``stage`` is drawn or loaded from (the first stage's model fields that make it,
    and the pipeline seed a fresh model is drawn with): part of the evaluation's fingerprint."""
    model = pipeline.stages[base_stage(pipeline, stage)].model.model_dump(mode="json")
    return {key: model[key] for key in BASE_FIELDS if key in model}


def load_base_model(pipeline: PipelineConfig, stage: str) -> ModelAdapter:
    """The base model of ``stage``, as its first stage builds it before training (without LoRA or quantization)."""
    from flowpost.stage import starting_adapter

    first = base_stage(pipeline, stage)
    return starting_adapter(pipeline.stages[first].model, seed=pipeline.seed, where=f"stages.{first}")
