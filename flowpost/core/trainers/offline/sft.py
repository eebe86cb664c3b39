"""Supervised fine-tuning with the flow-matching loss on (prompt, image) demonstrations."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import Field

from flowpost.core.contracts import OFFLINE_EXECUTION_CONTRACT, ExecutionContract, Paradigm
from flowpost.core.models.base import ConditionBatch
from flowpost.core.noise import addressed_rand, addressed_randn
from flowpost.core.sampling.schedules import logit_normal_sigmas
from flowpost.core.trainers.arguments import TrainerArguments
from flowpost.core.trainers.base import BaseTrainer
from flowpost.errors import FlowpostError

NULL_PROMPT = ""


class SFTArguments(TrainerArguments):
    """``train:`` of an SFT stage."""

    execution_contract: ClassVar[ExecutionContract] = OFFLINE_EXECUTION_CONTRACT
    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED

    logit_mean: float = 0.0
    logit_std: float = Field(1.0, gt=0)
    cfg_dropout: float = Field(0.1, ge=0, le=1, description="probability of the null prompt")


def flow_matching_loss(velocity: torch.Tensor, noise: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """Mean over all elements of ``(v - (noise - x0))**2``, computed in fp32."""
    return (velocity.float() - (noise.float() - x0.float())).pow(2).mean()


def noised(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """``(1 - sigma) * x0 + sigma * noise`` with per-sample sigma [B]."""
    s = sigma.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
    return (1.0 - s) * x0 + s * noise


class SFTTrainer(BaseTrainer):
    """Flow matching with logit-normal sigmas and condition dropout for classifier-free guidance."""

    execution_contract: ClassVar[ExecutionContract] = OFFLINE_EXECUTION_CONTRACT
    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED
    args: SFTArguments

    def setup(self) -> None:
        from flowpost.data.condition_cache import load_condition_table
        from flowpost.data.loaders import DemonstrationDataset
        from flowpost.data.shards import read_shards

        if self.spec.dataset_dir is None or self.spec.conditions_dir is None:
            raise FlowpostError(
                "an sft stage needs data: {dataset, conditions}", where=f"stages.{self.stage}.data"
            )
        from flowpost.core.io import read_json

        data_dir = Path(self.spec.dataset_dir) / "train"
        records = read_shards(data_dir, read_json(data_dir / "manifest.json", what="dataset manifest"))
        self.dataset = DemonstrationDataset(records)
        prompts, table = load_condition_table(
            Path(self.spec.conditions_dir), self.spec.encoder_fingerprint or ""
        )
        self.prompt_rows = {prompt: row for row, prompt in enumerate(prompts)}
        if NULL_PROMPT not in self.prompt_rows:
            raise FlowpostError(
                "the condition cache lacks the null prompt; re-run the conditions node",
                where=self.spec.conditions_dir,
            )
        self.conditions = table

    def build_loader(self) -> Any:
        from flowpost.data.loaders import FiniteLoader

        return FiniteLoader(
            self.dataset,
            global_batch_size=self.args.batch_size,
            seed=self.spec.seed,
            rank=self.accelerator.process_index,
            world_size=self.accelerator.num_processes,
        )

    def optimize_batch(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        device = self.accelerator.device
        x0 = self.adapter.encode_output_state(batch["image"].to(device))
        n = x0.shape[0]
        address = {
            "seed": self.spec.seed,
            "stage": self.stage,
            "step": self.progress.optimizer_step,
            "indices": self.sample_indices(n),
        }
        noise = addressed_randn(x0.shape[1:], purpose="noise", **address).to(device, x0.dtype)
        normals = addressed_randn((), purpose="sigma", **address)
        dropped = addressed_rand((), purpose="cfg-dropout", **address) < self.args.cfg_dropout
        sigma = logit_normal_sigmas(
            normals, mean=self.args.logit_mean, std=self.args.logit_std, shift=self.adapter.shift
        ).to(device)
        prompts = [
            NULL_PROMPT if drop else p for p, drop in zip(batch["prompt"], dropped.tolist(), strict=True)
        ]
        state = self.adapter.prepare_condition_state(self._conditions_for(prompts).to(device, x0.dtype))
        velocity = self.adapter.velocity(noised(x0, noise, sigma), sigma, state)
        return {"loss": flow_matching_loss(velocity, noise, x0)}

    def _conditions_for(self, prompts: list[str]) -> ConditionBatch:
        try:
            rows = [self.prompt_rows[p] for p in prompts]
        except KeyError as exc:
            raise FlowpostError(
                f"prompt {exc.args[0]!r} is not in the condition cache; re-run the conditions node",
                where=self.spec.conditions_dir,
            ) from None
        return self.conditions.index(rows)
