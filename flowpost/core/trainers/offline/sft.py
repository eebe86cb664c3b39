"""Supervised fine-tuning with the flow-matching loss on (prompt, image) demonstrations."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field

from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.contracts import Paradigm
from flowpost.core.logging import get_logger
from flowpost.core.noise import addressed_rand, addressed_randn
from flowpost.core.sampling.schedules import logit_normal_sigmas
from flowpost.core.trainers.arguments import DatasetArguments
from flowpost.core.trainers.dataset import DatasetTrainer
from flowpost.core.trainers.inputs import BatchLoader
from flowpost.core.trainers.matching import flow_matching_loss, noised
from flowpost.errors import FlowpostError

log = get_logger(__name__)
CFG_DROPOUT = 0.1  # the null prompt's probability for a family sampled with classifier-free guidance


class SFTArguments(DatasetArguments):
    """``train:`` of an SFT stage."""

    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED
    reads_latents: ClassVar[bool] = True

    logit_mean: float = 0.0
    logit_std: float = Field(1.0, gt=0)
    cfg_dropout: float = Field(
        CFG_DROPOUT, ge=0, le=1, description="probability of the null prompt; default 0 for a guidance-distilled family"
    )

    @classmethod
    def for_family(cls, train: dict[str, Any], family: str) -> dict[str, Any]:
        """No caption dropout by default for a guidance-distilled family (FLUX.1), which samples without
        classifier-free guidance; an explicit ``cfg_dropout`` is kept, with a warning when it drops captions."""
        from flowpost.core.models.registry import FAMILY_REGISTRY, adapter_class

        # a family that cannot be loaded is left to the stage's checks, which name it
        if FAMILY_REGISTRY.problem(family, where="model.family") or not adapter_class(family).guidance_distilled:
            return train
        if "cfg_dropout" not in train:
            return {**train, "cfg_dropout": 0.0}
        if isinstance(dropout := train["cfg_dropout"], int | float) and dropout > 0:
            log.warning(
                "cfg_dropout %s on the guidance-distilled family %r trains an unconditional branch its sampling "
                "never uses; set cfg_dropout: 0 unless you mean to",
                dropout,
                family,
            )
        return train


class SFTTrainer(DatasetTrainer):
    """Flow matching with logit-normal sigmas and condition dropout for classifier-free guidance."""

    Arguments = SFTArguments
    args: SFTArguments

    def setup(self) -> None:
        where = f"stages.{self.stage}.data"
        self.conditions = self.inputs.require("conditions", where=where)
        self.loader_factory = self.inputs.require("demonstrations", where=where)
        if NULL_PROMPT not in self.conditions:
            raise FlowpostError(
                "the condition cache lacks the null prompt; re-run the conditions node",
                where=self.conditions.where,
            )

    def build_loader(self) -> BatchLoader:
        return self.rank_loader(self.loader_factory)

    def optimize_batch(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        device = self.accelerator.device
        x0 = self.clean_latents(batch, "image")
        n = x0.shape[0]
        address = self.noise_address(n)
        noise = addressed_randn(x0.shape[1:], purpose="noise", **address).to(device, x0.dtype)
        normals = addressed_randn((), purpose="sigma", **address)
        dropped = addressed_rand((), purpose="cfg-dropout", **address) < self.args.cfg_dropout
        drawn = logit_normal_sigmas(
            normals, mean=self.args.logit_mean, std=self.args.logit_std, shift=self.adapter.shift
        )
        sigma = self.adapter.training_sigmas(drawn).to(device)
        prompts = [NULL_PROMPT if drop else p for p, drop in zip(batch["prompt"], dropped.tolist(), strict=True)]
        state = self.adapter.prepare_condition_state(self.conditions.lookup(prompts).to(device, x0.dtype))
        velocity = self.adapter.velocity(noised(x0, noise, sigma), sigma, state)
        return {"loss": flow_matching_loss(velocity, noise, x0)}
