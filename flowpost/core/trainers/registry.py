"""The trainers: the built-ins (a static, lowercase dict imported lazily) and plugins; a trainer names its
arguments class."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowpost.core.plugins import Registry
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.trainers.arguments import TrainerArguments
    from flowpost.core.trainers.base import BaseTrainer

TRAINERS: dict[str, str] = {
    "sft": "flowpost.core.trainers.offline.sft:SFTTrainer",
    "offline-dpo": "flowpost.core.trainers.offline.dpo:OfflineDPOTrainer",
    "grpo": "flowpost.core.trainers.rl.grpo:GRPOTrainer",
    "grpo-guard": "flowpost.core.trainers.rl.grpo_guard:GRPOGuardTrainer",
    "mixgrpo": "flowpost.core.trainers.rl.mixgrpo:MixGRPOTrainer",
    "dppo": "flowpost.core.trainers.rl.dppo:DPPOTrainer",
    "branchgrpo": "flowpost.core.trainers.rl.branchgrpo:BranchGRPOTrainer",
    "online-dpo": "flowpost.core.trainers.rl.online_dpo:OnlineDPOTrainer",
    "awm": "flowpost.core.trainers.rl.awm:AWMTrainer",
    "nft": "flowpost.core.trainers.rl.nft:NFTTrainer",
    "dgpo": "flowpost.core.trainers.rl.dgpo:DGPOTrainer",
    "crd": "flowpost.core.trainers.rl.crd:CRDTrainer",
    "dmd2": "flowpost.core.trainers.distill.dmd2:DMD2Trainer",
    "tdm": "flowpost.core.trainers.distill.tdm:TDMTrainer",
    "tdm-r1": "flowpost.core.trainers.distill.tdm_r1:TDMR1Trainer",
    "consistency": "flowpost.core.trainers.distill.consistency:ConsistencyTrainer",
    "diffusion-opd": "flowpost.core.trainers.distill.opd:OPDTrainer",
    "kd": "flowpost.core.trainers.distill.kd:KDTrainer",
}
TRAINER_REGISTRY = Registry(
    "trainer",
    plural="trainers",
    group="flowpost.trainers",
    builtins=TRAINERS,
    base="flowpost.core.trainers.base:BaseTrainer",
)


def trainer_class(name: str, *, where: str = "trainer") -> type[BaseTrainer]:
    """The trainer ``name`` stands for (its contract was checked when its class was defined)."""
    return TRAINER_REGISTRY.load(name, where=where)


def arguments_class(name: str, *, where: str = "trainer") -> type[TrainerArguments]:
    """The arguments class of trainer ``name`` (the ``train:`` section's schema)."""
    trainer = trainer_class(name, where=where)
    if not hasattr(trainer, "Arguments"):
        raise FlowpostError(
            f"trainer {name!r} names no arguments class; set Arguments to a DatasetArguments or OnlineArguments "
            "subclass on it",
            where=where,
        )
    return trainer.Arguments
