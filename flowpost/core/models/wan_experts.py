"""Wan2.2-A14B's two experts as one network: the high-noise transformer (the pipeline's ``transformer``) denoises
timesteps at or above the boundary, the low-noise one (``transformer_2``) those below, as diffusers' ``WanPipeline``
routes each denoising step; a batch of mixed timesteps is split between them, row by row."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from torch import Tensor, nn

EXPERT_COMPONENTS = {"high": "transformer", "low": "transformer_2"}  # expert -> its pipeline component
EXPERT_CHOICES = ("both", "high", "low")  # the ``experts`` option: which of them train


class WanExperts(nn.Module):
    """``high`` and ``low`` ``WanTransformer3DModel``s behind one call; ``boundary_timestep`` (``boundary_ratio``
    times the scheduler's ``num_train_timesteps``) is set by the family once it has read the pipeline."""

    _repeated_blocks: ClassVar[tuple[str, ...]] = ("WanTransformerBlock",)
    routed_experts: ClassVar[int] = 2  # networks it holds, of which one runs each sample

    def __init__(self, high: nn.Module, low: nn.Module) -> None:
        super().__init__()
        self.high, self.low = high, low
        self.boundary_timestep: float | None = None

    @property
    def config(self) -> Any:
        """The high-noise expert's config (both share one architecture)."""
        return self.high.config

    @property
    def _hf_peft_config_loaded(self) -> bool:  # what ``has_lora`` and the quantizer read: LoRA on either expert
        return any(getattr(expert, "_hf_peft_config_loaded", False) for _, expert in self.named_experts())

    def named_experts(self) -> Iterator[tuple[str, nn.Module]]:
        """``("high", transformer)`` then ``("low", transformer_2)``."""
        yield "high", self.high
        yield "low", self.low

    def routes_high(self, timestep: Tensor) -> Tensor:
        """Which rows the high-noise expert denoises: ``timestep >= boundary_timestep``, the stock comparison."""
        if self.boundary_timestep is None:
            raise RuntimeError("the boundary timestep is set by the family that loads the experts")
        return timestep >= self.boundary_timestep

    def forward(
        self, hidden_states: Tensor, timestep: Tensor, encoder_hidden_states: Tensor, return_dict: bool = False
    ) -> tuple[Tensor]:
        """Each row through its expert (``timestep`` is per row, ``[B]``); the velocities in row order."""
        high = self.routes_high(timestep)
        everywhere = bool(high.all())
        if everywhere or not bool(high.any()):
            expert = self.high if everywhere else self.low
            return (expert(hidden_states, timestep, encoder_hidden_states, return_dict=False)[0],)
        parts = [
            (rows, expert(hidden_states[rows], timestep[rows], encoder_hidden_states[rows], return_dict=False)[0])
            for rows, expert in ((high, self.high), (~high, self.low))
        ]
        first = parts[0][1]
        out = first.new_empty(hidden_states.shape[0], *first.shape[1:])
        for rows, velocity in parts:
            out[rows] = velocity.to(out.dtype)
        return (out,)

    def set_attention_backend(self, backend: str) -> None:
        for _, expert in self.named_experts():
            expert.set_attention_backend(backend)  # type: ignore[operator]

    @property
    def is_gradient_checkpointing(self) -> bool:
        return all(getattr(expert, "is_gradient_checkpointing", False) for _, expert in self.named_experts())
