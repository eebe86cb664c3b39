"""The optimizer settings a stage's ``train:`` section and each ``optimizers.<role>`` entry share, under one
set of names."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from flowpost.core.config.base import StrictModel


class AdamWSettings(StrictModel):
    """AdamW's learning rate, weight decay and betas, and a linear learning-rate warm-up."""

    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's betas (with muon: its AdamW part's)")
    warmup_steps: int = Field(0, ge=0, description="optimizer updates of linear learning-rate warm-up")

    @model_validator(mode="before")
    @classmethod
    def _betas_are_adam_betas(cls, data: Any) -> Any:
        """``betas`` (what ``optimizers.<role>`` entries called them before) is refused with its name now."""
        if isinstance(data, dict) and "betas" in data:
            raise ValueError("betas is called adam_betas (as in train:); rename the key to adam_betas")
        return data
