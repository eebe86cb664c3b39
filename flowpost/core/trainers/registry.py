"""Static, lowercase registries of trainers and their arguments classes (lazy imports)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowpost.core.contracts import check_contracts
from flowpost.core.lazy import import_object
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.trainers.arguments import TrainerArguments
    from flowpost.core.trainers.base import BaseTrainer

TRAINERS: dict[str, str] = {
    "sft": "flowpost.core.trainers.offline.sft:SFTTrainer",
    "grpo": "flowpost.core.trainers.rl.grpo:GRPOTrainer",
    "grpo-guard": "flowpost.core.trainers.rl.grpo_guard:GRPOGuardTrainer",
    "dppo": "flowpost.core.trainers.rl.dppo:DPPOTrainer",
    "online-dpo": "flowpost.core.trainers.rl.online_dpo:OnlineDPOTrainer",
    "awm": "flowpost.core.trainers.rl.awm:AWMTrainer",
    "nft": "flowpost.core.trainers.rl.nft:NFTTrainer",
}
ARGUMENTS: dict[str, str] = {
    "sft": "flowpost.core.trainers.offline.sft:SFTArguments",
    "grpo": "flowpost.core.trainers.rl.grpo:GRPOArguments",
    "grpo-guard": "flowpost.core.trainers.rl.grpo_guard:GRPOGuardArguments",
    "dppo": "flowpost.core.trainers.rl.dppo:DPPOArguments",
    "online-dpo": "flowpost.core.trainers.rl.online_dpo:OnlineDPOArguments",
    "awm": "flowpost.core.trainers.rl.awm:AWMArguments",
    "nft": "flowpost.core.trainers.rl.nft:NFTArguments",
}


def _check_name(name: str, where: str) -> str:
    if name not in TRAINERS:
        known = ", ".join(sorted(TRAINERS))
        raise FlowpostError(f"unknown trainer {name!r}; known trainers: {known}", where=where)
    return name


def arguments_class(name: str, *, where: str = "trainer") -> type[TrainerArguments]:
    """The arguments class registered for trainer ``name``."""
    return import_object(ARGUMENTS[_check_name(name, where)])


def trainer_class(name: str, *, where: str = "trainer") -> type[BaseTrainer]:
    """The trainer class registered for ``name``, checked against its arguments class."""
    trainer = import_object(TRAINERS[_check_name(name, where)])
    check_contracts(trainer, arguments_class(name, where=where), where=where)
    return trainer
