"""The export of a stage's weights and the promotion gate in front of the promoted export."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from flowpost.core.config.base import OmittingModel, StrictModel
from flowpost.core.evaluation.samples import Better
from flowpost.errors import FlowpostError


class PromoteConfig(StrictModel):
    """The promotion gate: an export replaces the promoted one unless a metric regresses beyond ``tolerance``.

    ``metrics`` names keys of ``evaluate.metrics``; a key without a direction (null, or listed alone) takes the
    metric's own, which the pipeline fills in when it loads."""

    metrics: dict[str, Better | None] = Field(
        min_length=1, description="evaluated metric key -> which direction is better; null: the metric's own"
    )
    tolerance: float = Field(0.0, ge=0, description="allowed absolute regression of each metric")

    @field_validator("metrics", mode="before")
    @classmethod
    def _listed_keys(cls, value: Any) -> Any:
        """A list of keys gates each on its metric's own direction."""
        return dict.fromkeys(value) if isinstance(value, list) else value

    def directions(self) -> dict[str, Better]:
        """Each gated key's direction; a key still without one is an error naming it."""
        unresolved = [key for key, better in self.metrics.items() if better is None]
        if unresolved:
            raise FlowpostError(
                f"no direction for {', '.join(unresolved)}; give higher or lower", where="export.promote.metrics"
            )
        return {key: better for key, better in self.metrics.items() if better is not None}


class ExportConfig(OmittingModel):
    """Which stage is exported, in which formats; ``promote`` (left out of the params while unset, so
    pipelines without a gate keep their params) gates promoting the export."""

    OMITTED_AT_DEFAULT = ("promote",)

    from_stage: str = Field(alias="from")
    formats: list[Literal["diffusers", "pipeline", "kohya"]] = Field(
        default_factory=lambda: ["diffusers"],
        description="diffusers: transformer/ (and lora/ when the stage trained LoRA); pipeline: a complete "
        "diffusers pipeline folder (families loaded from model.pretrained); kohya: the LoRA as one "
        "lora_kohya.safetensors in the kohya / ComfyUI key layout (flux1, flux1-kontext, qwen-image)",
    )
    promote: PromoteConfig | None = None
