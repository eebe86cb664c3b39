"""Trainer arguments: the ``train:`` section of a stage, one class per trainer."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from flowpost.core.config.base import StrictModel
from flowpost.core.contracts import ExecutionContract, Paradigm


class TrainerArguments(StrictModel):
    """Fields every trainer shares. Batch sizes are global (across ranks); budgets are counts."""

    execution_contract: ClassVar[ExecutionContract]
    paradigm: ClassVar[Paradigm]

    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(0, ge=0)
    batch_size: int = Field(64, ge=1, description="global micro-batch size across all ranks")
    gradient_accumulation_steps: int = Field(1, ge=1)
    max_steps: int = Field(100, ge=1, description="optimizer steps")
    checkpoint_every: int = Field(0, ge=0, description="optimizer steps between checkpoints; 0: end only")
    log_every: int = Field(10, ge=1)

    def smoke(self) -> TrainerArguments:
        """A copy with every budget cut to a few steps, for wiring checks."""
        return self.model_copy(
            update={
                "max_steps": min(self.max_steps, 3),
                "checkpoint_every": 2 if self.checkpoint_every else 0,
                "warmup_steps": 0,
                "log_every": 1,
            }
        )
