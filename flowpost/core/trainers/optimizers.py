"""One optimizer per trainable role (``optimizers:`` of a stage): AdamW, AdamW with 8-bit moments, or Muon on
the 2-D weights with AdamW on the rest; each with its warm-up schedule and its update counter."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from flowpost.core.config.base import OmittingModel
from flowpost.core.trainers.eight_bit import adamw8bit, check_eight_bit
from flowpost.core.trainers.optimizer_settings import AdamWSettings
from flowpost.errors import FlowpostError

MUON_ONLY = ("momentum", "adamw_lr")
MUON_BACKENDS = ("ddp",)  # Muon orthogonalises whole matrices: sharded parameters cannot take it


class OptimizerConfig(AdamWSettings, OmittingModel):
    """One role's optimizer: ``adamw``, ``adamw8bit`` (8-bit moments), or ``muon`` (``torch.optim.Muon`` on 2-D
    weights, AdamW on the rest); its warm-up counts this role's updates."""

    name: Literal["adamw", "adamw8bit", "muon"] = "adamw"
    lr: float = Field(gt=0)
    momentum: float = Field(0.95, gt=0, lt=1, description="muon: momentum of the orthogonalised update")
    adamw_lr: float | None = Field(None, gt=0, description="muon: lr of the AdamW part; default: lr")

    @model_validator(mode="after")
    def _muon_only(self) -> OptimizerConfig:
        unused = [key for key in MUON_ONLY if key in self.model_fields_set]
        if self.name != "muon" and unused:
            raise ValueError(f"{', '.join(unused)} apply to name: muon only; remove them or set name: muon")
        return self

    def inapplicable(self) -> tuple[str, ...]:
        """Muon's fields in an AdamW entry (the re-validated form must not set them)."""
        return MUON_ONLY if self.name != "muon" else ()


def muon_groups(parameters: Iterable[tuple[str, nn.Parameter]]) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """``(matrices, rest)``: the 2-D weights Muon orthogonalises, and everything AdamW keeps (biases,
    norms, convolutions, tensors of other ranks)."""
    matrices, rest = [], []
    for _, param in parameters:
        (matrices if param.ndim == 2 else rest).append(param)
    return matrices, rest


class RoleOptimizer:
    """The optimizers of one role stepped as one: ``step``, ``zero_grad``, a warm-up schedule, a counter.

    ``optimizer`` is the list of torch optimizers, the form the parallel layouts read and write
    (``get_optimizer_state_dict`` takes several).
    """

    def __init__(
        self, role: str, parameters: list[nn.Parameter], optimizers: list[torch.optim.Optimizer], *, warmup_steps: int
    ) -> None:
        self.role = role
        self.parameters = parameters
        self.optimizer = optimizers
        self.scheduler = RoleSchedule(optimizers, warmup_steps)
        self.updates = 0

    def step(self) -> None:
        for optimizer in self.optimizer:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizer:
            optimizer.zero_grad(set_to_none=set_to_none)


class RoleSchedule:
    """Linear warm-up over a role's updates, the same for each of its optimizers."""

    def __init__(self, optimizers: list[torch.optim.Optimizer], warmup_steps: int) -> None:
        def factor(step: int) -> float:
            return min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0

        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(optimizer, factor) for optimizer in optimizers]

    def step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()

    def get_last_lr(self) -> list[float]:
        return self.schedulers[0].get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return {"schedulers": [scheduler.state_dict() for scheduler in self.schedulers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for scheduler, saved in zip(self.schedulers, state["schedulers"], strict=True):
            scheduler.load_state_dict(saved)


def adamw(
    parameters: list[nn.Parameter], settings: AdamWSettings, *, eight_bit: bool, where: str
) -> torch.optim.Optimizer:
    """AdamW over ``parameters`` with ``settings``; with ``eight_bit``, torchao's 8-bit moments (``where``
    names the config key that chose it)."""
    hyper = {"lr": settings.lr, "betas": settings.adam_betas, "weight_decay": settings.weight_decay}
    return adamw8bit(parameters, **hyper, where=where) if eight_bit else torch.optim.AdamW(parameters, **hyper)


def build_role_optimizer(
    role: str, named: list[tuple[str, nn.Parameter]], config: OptimizerConfig, *, stage: str
) -> RoleOptimizer:
    """``config`` (``stages.<stage>.optimizers.<role>``)'s optimizer(s) over ``named``, the parameters role
    ``role`` owns."""
    parameters = [param for _, param in named]
    if config.name == "muon":
        matrices, rest = muon_groups(named)
        optimizers: list[torch.optim.Optimizer] = [
            torch.optim.Muon(matrices, lr=config.lr, weight_decay=config.weight_decay, momentum=config.momentum)
        ]
        if rest:
            lr = config.adamw_lr or config.lr
            optimizers.append(torch.optim.AdamW(rest, lr=lr, betas=config.adam_betas, weight_decay=config.weight_decay))
    else:
        where = f"stages.{stage}.optimizers.{role}.name"
        optimizers = [adamw(parameters, config, eight_bit=config.name == "adamw8bit", where=where)]
    return RoleOptimizer(role, parameters, optimizers, warmup_steps=config.warmup_steps)


def check_role_optimizers(
    roles: tuple[str, ...], optimizers: dict[str, OptimizerConfig], layout: str, processes: int, *, stage: str
) -> None:
    """One ``optimizers:`` entry per role, on a layout that keeps one optimizer per role (and, for
    Muon, whole matrices on every rank; for adamw8bit, replicated moments) over ``processes``."""
    where = f"stages.{stage}.optimizers"
    missing = [role for role in roles if role not in optimizers]
    unknown = [name for name in optimizers if name not in roles]
    if missing or unknown:
        raise FlowpostError(
            f"the trainer trains the roles {', '.join(roles)}: one optimizers entry each"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; not a role: {', '.join(unknown)}" if unknown else ""),
            where=where,
        )
    if layout == "deepspeed-zero2":
        raise FlowpostError(
            "deepspeed-zero2 steps one optimizer, and this trainer has one per role; use ddp or fsdp2",
            where=f"stages.{stage}.launch.backend",
        )
    for role, config in optimizers.items():
        if config.name == "muon" and layout not in MUON_BACKENDS:
            raise FlowpostError(
                f"torch.optim.Muon orthogonalises whole matrices and cannot step {layout} shards; "
                "use launch.backend ddp or name: adamw",
                where=f"{where}.{role}.name",
            )
        if config.name == "adamw8bit":
            check_eight_bit(layout, processes, where=f"{where}.{role}.name")
