"""The wan22-a14b family: a two-expert Wan2.2 ``WanPipeline`` (A14B text to video), its high-noise ``transformer``
and low-noise ``transformer_2`` trained together or one of them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.io import write_json_atomic
from flowpost.core.models.base import ADAPTER_FILE, LORA_BASE_DIR, LORA_DIR
from flowpost.core.models.block_checkpointing import BlockCheckpointing, set_block_checkpointing
from flowpost.core.models.lora import add_lora, base_copy, has_lora, save_lora, without_lora
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.wan2 import Wan2Adapter, pipeline_index
from flowpost.core.models.wan_experts import EXPERT_CHOICES, EXPERT_COMPONENTS, WanExperts
from flowpost.errors import FlowpostError

LORA_DIRS = {"high": LORA_DIR, "low": f"{LORA_DIR}_2"}  # transformer's adapters, transformer_2's


class Wan22Adapter(Wan2Adapter):
    """Wan2.1-shaped video latents, UMT5 conditions and true CFG as ``wan2``, denoised by two experts: the
    high-noise one at timesteps ``>= boundary_ratio * num_train_timesteps``, the low-noise one below, row by row.

    ``experts`` (``both``, ``high``, ``low``) names the experts that train (LoRA or full fine-tuning); the others
    stay frozen, and SFT draws its sigmas inside the trained expert's range. ``low_noise_guidance`` is the
    low-noise expert's guidance scale (the stock pipeline's ``guidance_scale_2``); None: the sampling guidance.
    """

    family: ClassVar[str] = "wan22-a14b"
    encoder_name = "wan22-a14b"  # its own UMT5, named by the family as the conditions node names it
    options: ClassVar[tuple[str, ...]] = (*Wan2Adapter.options, "experts", "low_noise_guidance")
    fsdp_shardable: ClassVar[bool] = False  # each rank's rows go to their own expert

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        experts: str = "both",
        low_noise_guidance: float | None = None,
        gradient_checkpointing: BlockCheckpointing = False,
        **options: Any,
    ) -> None:
        if experts not in EXPERT_CHOICES:
            raise FlowpostError(
                f"experts is {experts!r}; give one of {', '.join(EXPERT_CHOICES)}", where="model.options.experts"
            )
        assert isinstance(transformer, WanExperts)
        super().__init__(transformer, scheduler, source, gradient_checkpointing=gradient_checkpointing, **options)
        index = pipeline_index(source)
        self.check_experts(index, source)
        self.boundary_ratio = float(index["boundary_ratio"])
        transformer.boundary_timestep = self.boundary_ratio * scheduler.config.num_train_timesteps
        self.experts, self.low_noise_guidance = experts, low_noise_guidance
        for name, expert in transformer.named_experts():
            if name not in self.trained_experts():
                expert.requires_grad_(False)

    @classmethod
    def check_experts(cls, index: dict[str, Any], source: PretrainedSource) -> None:
        """Refuse a pipeline without ``boundary_ratio``: one transformer, the ``wan2`` family's."""
        if index.get("boundary_ratio") is None:
            raise FlowpostError(
                "a one-transformer Wan pipeline (no boundary_ratio); wan22-a14b trains two experts: set "
                "model.family: wan2",
                where=f"{source.path}/model_index.json",
            )

    @staticmethod
    def _transformer(source: PretrainedSource, loader: Any, *, weights: bool) -> torch.nn.Module:
        """Both experts (``weights=False``: on the meta device, from their configs)."""
        read = source.load if weights else source.empty
        return WanExperts(*(read(component, loader) for component in EXPERT_COMPONENTS.values()))

    def trained_experts(self) -> tuple[str, ...]:
        """The experts that train: ``high``, ``low`` or both."""
        return ("high", "low") if self.experts == "both" else (self.experts,)

    def routes_high(self, sigma: Tensor) -> Tensor:
        """Which of the per-row ``sigma`` the high-noise expert denoises (at the timestep the transformer sees)."""
        return self.transformer.routes_high(self.timestep(sigma.float()))

    def training_sigmas(self, sigma: Tensor) -> Tensor:
        """Draws in [0, 1] scaled onto the trained expert's sigmas: ``[boundary_ratio, 1]`` for the high-noise
        expert, ``[0, boundary_ratio]`` for the low-noise one; unchanged when both train."""
        if self.experts == "high":
            return self.boundary_ratio + (1.0 - self.boundary_ratio) * sigma
        if self.experts == "low":
            return self.boundary_ratio * sigma
        return sigma

    def set_gradient_checkpointing(self, setting: BlockCheckpointing) -> None:
        """Per expert: every block (``True``) or the first ``setting`` blocks of each."""
        for _, expert in self.transformer.named_experts():
            set_block_checkpointing(expert, setting, where="model.options.gradient_checkpointing")

    def shard_units(self) -> list[torch.nn.Module]:
        """None: FSDP2 gathers a block's shards collectively, and ranks route their rows to different experts."""
        raise FlowpostError(
            "family wan22-a14b routes each rank's samples to its own expert, which sharded blocks (gathered by every "
            "rank at once) cannot follow; use launch.backend: ddp or deepspeed-zero2",
            where="launch.backend",
        )

    def add_lora(self, *, rank: int, alpha: float, targets: list[str] | None = None) -> None:
        """Adapters on each trained expert; ``lora["experts"]`` names them."""
        chosen = list(targets or self.lora_targets)
        for name, expert in self.transformer.named_experts():
            if name in self.trained_experts():
                add_lora(expert, rank=rank, alpha=alpha, targets=chosen)
        base = "pretrained" if self.transformer_is_pipelines else LORA_BASE_DIR
        self.lora = {"rank": rank, "alpha": alpha, "targets": chosen, "base": base, "experts": self.trained_experts()}

    def add_component_variants(self, roles: Sequence[str]) -> None:
        if has_lora(self.transformer):
            raise FlowpostError(
                f"trainer roles ({', '.join(roles)}) share one LoRA base in flowpost, which the two experts of "
                "family wan22-a14b do not support; fine-tune fully or use a one-network trainer",
                where="model.lora",
            )
        super().add_component_variants(roles)

    def forward(
        self,
        latents: Tensor,
        sigma: Tensor,
        state: ConditionState,
        *,
        guidance: float = 1.0,
        negative: ConditionState | None = None,
    ) -> Tensor:
        """True CFG at ``guidance`` for the high-noise expert's rows and ``low_noise_guidance`` for the low-noise
        one's, as the stock pipeline guides each expert (no CFG at all when ``guidance`` is 1)."""
        low = self.low_noise_guidance
        if guidance == 1.0 or low is None or low == guidance:
            return super().forward(latents, sigma, state, guidance=guidance, negative=negative)
        if negative is None:
            raise ValueError("guidance != 1 needs the negative (null-prompt) condition state")
        both = type(state).cat([state, negative])
        sigma_t = torch.as_tensor(sigma, dtype=latents.dtype, device=latents.device).expand(latents.shape[0])
        v_pos, v_neg = self.velocity(torch.cat([latents, latents]), torch.cat([sigma_t, sigma_t]), both).chunk(2)
        scale = torch.where(self.routes_high(sigma_t), guidance, low).to(v_pos.dtype)
        return self.guided(v_pos, v_neg, scale.view(-1, *[1] * (v_pos.dim() - 1)))  # type: ignore[arg-type]

    def pipeline_networks(self) -> dict[str, torch.nn.Module]:
        return {EXPERT_COMPONENTS[name]: without_lora(e) for name, e in self.transformer.named_experts()}

    def save_pretrained(self, path: str | Path) -> None:
        """``transformer/`` and ``transformer_2/`` (LoRA merged) as the pipeline holds them; a LoRA expert's
        adapters alone in ``lora/`` (high) or ``lora_2/`` (low, for ``load_lora_weights(...,
        load_into_transformer_2=True)``), and its unmerged weights in ``lora_base/`` unless the pipeline's."""
        path = Path(path)
        for name, expert in self.transformer.named_experts():
            component = EXPERT_COMPONENTS[name]
            if has_lora(expert):
                save_lora(expert, path / LORA_DIRS[name], pipeline_class=self.pipeline_class)
                if not self.transformer_is_pipelines:
                    base_copy(expert).save_pretrained(path / LORA_BASE_DIR / component, safe_serialization=True)
            without_lora(expert).save_pretrained(path / component, safe_serialization=True)
        self.scheduler.save_pretrained(path / "scheduler")
        write_json_atomic(path / ADAPTER_FILE, self.describe())

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "boundary_ratio": self.boundary_ratio}
