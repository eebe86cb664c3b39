"""A training stage: its trainer, model, data, optimizers, rewards, callbacks and launch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from flowpost.core.config.base import OmittingModel, StrictModel
from flowpost.core.config.schema.evaluation import GuardConfig
from flowpost.core.config.schema.models import ModelConfig
from flowpost.core.config.schema.names import Key
from flowpost.core.config.schema.rewards import RewardConfig
from flowpost.core.extras import DEEPSPEED_INSTALL, deepspeed_installed
from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.trainers.arguments import TrainerArguments
from flowpost.core.trainers.optimizers import OptimizerConfig
from flowpost.core.trainers.registry import arguments_class


class DataRef(OmittingModel):
    """The dataset and condition cache a stage reads; ``prompts`` replaces the rollout prompt pool. Without a
    latent cache, ``latents`` is left out, so such stages keep their params."""

    OMITTED_AT_DEFAULT = ("latents",)

    dataset: str
    conditions: str
    prompts: str | None = Field(None, description="a prompt-files dataset whose prompts generating trainers roll out")
    latents: str | None = Field(None, description="a latent cache (latents.<name>) of the dataset, read instead of it")


class EMAConfig(StrictModel):
    decay: float = Field(0.999, gt=0, lt=1)
    schedule: Literal["warmup", "constant", "power", "linear"] = Field(
        "warmup",
        description="warmup: min(decay, (1+n)/(10+n)); constant; power: min(decay, 1-(1+n)^-power); "
        "linear: decay*min(1, n/warmup_steps)",
    )
    warmup_steps: int = Field(100, ge=1, description="optimizer steps of the linear schedule's ramp")
    power: float = Field(2 / 3, gt=0, description="exponent of the power schedule")


class GradClipConfig(StrictModel):
    max_norm: float = Field(1.0, gt=0)


class ValidationConfig(StrictModel):
    every: int = Field(ge=1, description="optimizer steps between validation grids")
    prompts: list[str] = Field(min_length=1)
    samples_per_prompt: int = Field(4, ge=1)
    steps: int = Field(20, ge=1)
    guidance: float = Field(1.0, ge=0)


class CallbacksConfig(StrictModel):
    ema: EMAConfig | None = None
    grad_clip: GradClipConfig | None = None
    validation: ValidationConfig | None = None
    trackers: list[Literal["tensorboard", "dvclive", "wandb"]] = Field(default_factory=list)


class LaunchConfig(StrictModel):
    """How many processes train a stage. Topology (nodes, addresses) comes from flags/env."""

    num_processes: int = Field(1, ge=1, description="processes over all machines; global batch sizes are split")
    backend: Literal["ddp", "fsdp2", "deepspeed-zero2"] = "ddp"
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no", description="bf16: the network computes under bfloat16 autocast; weights, gradients, optimizer in fp32"
    )
    hang_timeout: float | None = Field(
        1800.0, gt=0, description="seconds without an event from the stage before it is killed as hung; null: never"
    )

    @model_validator(mode="after")
    def _available(self) -> LaunchConfig:
        if self.backend == "deepspeed-zero2" and self.num_processes > 1 and not deepspeed_installed():
            raise ValueError(f"backend 'deepspeed-zero2' needs DeepSpeed: {DEEPSPEED_INSTALL}, or use ddp or fsdp2")
        if self.mixed_precision == "fp16":
            raise ValueError("fp16 needs loss scaling, which flowpost does not do; use mixed_precision: bf16")
        return self


Offloaded = Literal["ref", "ema", "teacher", "old", "anchor", "vae", "rewards"]  # snapshot names, the VAE, rewards


class StageConfig(OmittingModel):
    """One training stage: a trainer, its model, data and arguments. ``optimizers`` (multi-role trainers),
    ``guard`` and ``offload`` are left out of the params when unset, so other stages keep their fingerprints."""

    OMITTED_AT_DEFAULT = ("optimizers", "guard", "offload")

    trainer: str
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataRef | None = None
    train: dict[str, Any] = Field(default_factory=dict)
    optimizers: dict[Key, OptimizerConfig] = Field(
        default_factory=dict, description="one optimizer per trainable role of a multi-role trainer (e.g. dmd2)"
    )
    sampling: SamplingConfig | None = None
    rewards: list[RewardConfig] = Field(default_factory=list)
    callbacks: CallbacksConfig = Field(default_factory=CallbacksConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    guard: GuardConfig | None = Field(
        None, description="evaluate held-out samples during the stage; stop at the last good checkpoint on a violation"
    )
    offload: list[Offloaded] = Field(
        default_factory=list,
        description="frozen weights held in host memory between the phases that use them: snapshots (ref, ema, "
        "teacher, old, anchor), the vae, the rewards' models",
    )

    @field_validator("offload")
    @classmethod
    def _offloaded_once(cls, value: list[str]) -> list[str]:
        if twice := sorted({name for name in value if value.count(name) > 1}):
            raise ValueError(f"{', '.join(twice)} is listed more than once; list each once")
        return value

    @field_validator("trainer")
    @classmethod
    def _lowercase(cls, value: str) -> str:
        if ":" not in value and value != value.lower():  # a registered name; a plugin's class path keeps its case
            raise ValueError(f"trainer names are lowercase; use {value.lower()!r}")
        return value

    def arguments(self, *, smoke: bool = False, where: str = "trainer") -> TrainerArguments:
        """The validated ``train:`` section as the trainer's arguments class."""
        arguments = arguments_class(self.trainer, where=where)
        args = arguments.model_validate(arguments.for_family(self.train, self.model.family))
        return args.smoke() if smoke else args
