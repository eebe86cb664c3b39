"""Trainer arguments: the ``train:`` section of a stage, one class per trainer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from flowpost.core.config.base import OmittingModel
from flowpost.core.contracts import (
    OFFLINE_EXECUTION_CONTRACT,
    ONLINE_EXECUTION_CONTRACT,
    ExecutionContract,
    Paradigm,
)
from flowpost.core.progress import BudgetUnit
from flowpost.core.trainers.optimizer_settings import AdamWSettings
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.sampling.config import SamplingConfig


class TrainerArguments(AdamWSettings, OmittingModel):
    """Fields every trainer shares: the optimizer's (``AdamWSettings``) and the cadences. Batch sizes are
    global (across ranks); budgets are counts. Fields added later are left out of the dump (params,
    fingerprints) while they hold their default (``OMITTED_AT_DEFAULT``).

    The arguments class declares its trainer's ``execution_contract`` (a dataset, or prompts it generates
    from; its feedback) and ``paradigm``, which the trainer naming it (``Arguments``) takes from here, and
    what a dataset it reads holds (``reads_latents``, ``reads_trajectories``).
    """

    execution_contract: ClassVar[ExecutionContract]
    paradigm: ClassVar[Paradigm]
    budget_unit: ClassVar[BudgetUnit]  # what ``budget``, checkpoint_every and log_every count
    reads_latents: ClassVar[bool] = False  # encodes dataset media, so a latent cache (data.latents) may replace them
    reads_trajectories: ClassVar[bool] = False  # its dataset is a teacher-trajectories source
    OMITTED_AT_DEFAULT = ("optimizer",)

    optimizer: Literal["adamw", "adamw8bit"] = Field(
        "adamw", description="adamw (fp32 moments) or adamw8bit (block-wise 8-bit moments, torchao)"
    )
    checkpoint_every: int = Field(
        0, ge=0, description="budget units (steps, or iterations of an online trainer) between checkpoints; 0: end only"
    )
    keep_last: int | None = Field(None, ge=1, description="checkpoints kept (the newest); null: all")
    log_every: int = Field(
        10, ge=1, description="budget units (steps, or iterations of an online trainer) between logged events"
    )
    max_bad_steps: int = Field(
        3, ge=1, description="optimizer steps in a row with a non-finite loss or gradients before the stage stops"
    )

    @classmethod
    def for_family(cls, train: dict[str, Any], family: str) -> dict[str, Any]:
        """``train`` with the defaults that depend on the model ``family`` filled where it leaves them unset."""
        return train

    def sampling_problems(self, sampling: SamplingConfig) -> list[str]:
        """What this trainer cannot run with in the stage's ``sampling:``, each ``"<path in the stage>: <why>"``."""
        return []

    def smoke(self) -> TrainerArguments:
        """A copy with every budget cut to a few units, for wiring checks."""
        return self.model_copy(
            update={"checkpoint_every": 2 if self.checkpoint_every else 0, "warmup_steps": 0, "log_every": 1}
        )


class DatasetArguments(TrainerArguments):
    """Trainers on a finite dataset: the budget is optimizer steps."""

    execution_contract: ClassVar[ExecutionContract] = OFFLINE_EXECUTION_CONTRACT
    budget_unit: ClassVar[BudgetUnit] = "step"

    batch_size: int = Field(64, ge=1, description="global micro-batch size across all ranks")
    gradient_accumulation_steps: int = Field(1, ge=1)
    max_steps: int = Field(100, ge=1, description="optimizer steps")

    @property
    def budget(self) -> int:
        """Budget units of the stage: optimizer steps."""
        return self.max_steps

    def smoke(self) -> DatasetArguments:
        return super().smoke().model_copy(update={"max_steps": min(self.max_steps, 3)})  # type: ignore[return-value]


class OnlineArguments(TrainerArguments):
    """Trainers that generate their data: the budget is rollout iterations.

    Each iteration samples ``prompts_per_iteration`` prompts, each ``group_size`` times. Rewards
    score them at run time unless a subclass declares the no-feedback contract.
    """

    execution_contract: ClassVar[ExecutionContract] = ONLINE_EXECUTION_CONTRACT
    budget_unit: ClassVar[BudgetUnit] = "iteration"

    iterations: int = Field(30, ge=1, description="rollout iterations")
    prompts_per_iteration: int = Field(8, ge=1)
    group_size: int = Field(8, ge=1)
    rollout_batch_size: int = Field(64, ge=1, description="global samples per rollout forward pass")
    train_batch_size: int = Field(32, ge=1, description="global samples per training micro-batch")
    gradient_accumulation_steps: int = Field(1, ge=1, description="micro-batches per optimizer step")
    inner_epochs: int = Field(1, ge=1, description="optimization passes over each rollout")
    OMITTED_AT_DEFAULT = (*TrainerArguments.OMITTED_AT_DEFAULT, "reward_normalisation", "overlap_rewards")

    advantage_std: Literal["group", "global"] = "group"
    advantage_clip: float = Field(5.0, gt=0)
    reward_normalisation: Literal["sum", "per_reward"] = Field(
        "sum",
        description="sum: advantages of the weighted reward sum; per_reward (GDPO): each reward normalised in its "
        "group, their weighted sum rescaled by its batch std",
    )

    overlap_rewards: bool = Field(
        False,
        description="decode and score each rollout forward batch (rollout_batch_size) on a worker thread while "
        "the next one samples (on CUDA, on a side stream); the rewards, advantages and losses are the same "
        "either way",
    )

    @property
    def budget(self) -> int:
        """Budget units of the stage: rollout iterations."""
        return self.iterations

    @property
    def samples_per_iteration(self) -> int:
        return self.prompts_per_iteration * self.group_size

    def smoke(self) -> OnlineArguments:
        return super().smoke().model_copy(update={"iterations": min(self.iterations, 2)})  # type: ignore[return-value]


def whole_groups(size: int, group: int | None, compared: str) -> int:
    """``train_batch_size`` ``size`` when it holds whole groups of ``group`` (a validator's check for a trainer
    that compares the samples of a group within one micro-batch; ``compared`` says what it compares)."""
    if group is not None and size % group:
        raise ValueError(
            f"{compared} within one micro-batch: train_batch_size ({size}) must be a multiple of group_size ({group})"
        )
    return size


def groups_fit_ranks(prompts: int, processes: int, *, where: str) -> None:
    """Refuse ``prompts`` per iteration that ``processes`` ranks cannot split into whole groups."""
    if prompts % processes:
        raise FlowpostError(
            f"the trainer compares the samples of a group, so every rank needs whole groups: prompts_per_iteration "
            f"({prompts}) must be a multiple of the number of processes ({processes})",
            where=where,
        )
