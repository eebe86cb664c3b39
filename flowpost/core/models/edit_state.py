"""The condition state of an edit family: the instruction's token states (read with the source images) and
mask, and each source image's packed latents with their patch grid."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.models.text_state import MaskedTextState


@dataclass
class EditState(MaskedTextState):
    """``MaskedTextState`` plus ``source_latents`` ``[B, S, C]``: the packed latent tokens of ``sources`` source
    images one after another, each on a square grid of ``S / sources`` tokens.

    The condition cache holds them flattened in each row's ``pooled`` vector (``S * C`` values), as the
    conditions node wrote them; ``from_edit_batch`` unflattens them."""

    source_latents: Tensor
    sources: int = 1

    @classmethod
    def from_edit_batch(cls, batch: ConditionBatch, channels: int, sources: int = 1) -> Self:
        """The text state of ``batch`` and its ``pooled`` rows as ``[B, S, channels]`` tokens of ``sources``
        square grids."""
        text = MaskedTextState.from_batch(batch)
        tokens, grid = batch.pooled.shape[1] // channels, batch.pooled.shape[1] // (channels * sources)
        grids = "square grid" if sources == 1 else f"{sources} square grids"
        if grid == 0 or grid * channels * sources != batch.pooled.shape[1] or math.isqrt(grid) ** 2 != grid:
            raise ValueError(
                f"cached rows of {batch.pooled.shape[1]} source values are no {grids} of {channels}-channel latent "
                "tokens; re-run the conditions node with this family's pipeline (and model.options.sources)"
            )
        source = batch.pooled.reshape(len(batch), tokens, channels)
        return cls(text.encoder_hidden_states, text.encoder_attention_mask, source, sources)

    @property
    def source_grid(self) -> int:
        """The side of each source's square grid of packed tokens."""
        return math.isqrt(int(self.source_latents.shape[1]) // self.sources)

    def text(self) -> MaskedTextState:
        """The token states and mask alone."""
        return MaskedTextState(self.encoder_hidden_states, self.encoder_attention_mask)

    def index(self, rows: Tensor | list[int]) -> Self:
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        text = self.text().index(rows_t)
        return type(self)(
            text.encoder_hidden_states, text.encoder_attention_mask, self.source_latents[rows_t], self.sources
        )

    @classmethod
    def cat(cls, states: Sequence[Self]) -> Self:
        text = MaskedTextState.cat([s.text() for s in states])
        source = torch.cat([s.source_latents for s in states])
        return cls(text.encoder_hidden_states, text.encoder_attention_mask, source, states[0].sources)
