"""The condition state of an edit family: the instruction's token states (read with the source image) and
mask, and the source image's packed latents with their patch grid."""

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
    """``MaskedTextState`` plus ``source_latents`` ``[B, S, C]``: the source's packed latent tokens, on a
    square grid of ``S`` tokens.

    The condition cache holds them flattened in each row's ``pooled`` vector (``S * C`` values), as the
    conditions node wrote them; ``from_edit_batch`` unflattens them."""

    source_latents: Tensor

    @classmethod
    def from_edit_batch(cls, batch: ConditionBatch, channels: int) -> Self:
        """The text state of ``batch`` and its ``pooled`` rows as ``[B, S, channels]`` source tokens."""
        text = MaskedTextState.from_batch(batch)
        tokens = batch.pooled.shape[1] // channels
        if tokens == 0 or tokens * channels != batch.pooled.shape[1] or math.isqrt(tokens) ** 2 != tokens:
            raise ValueError(
                f"cached rows of {batch.pooled.shape[1]} source values are no square grid of {channels}-channel "
                "latent tokens; re-run the conditions node with this family's pipeline"
            )
        source = batch.pooled.reshape(len(batch), tokens, channels)
        return cls(text.encoder_hidden_states, text.encoder_attention_mask, source)

    @property
    def source_grid(self) -> int:
        """The side of the source's square grid of packed tokens."""
        return math.isqrt(int(self.source_latents.shape[1]))

    def text(self) -> MaskedTextState:
        """The token states and mask alone."""
        return MaskedTextState(self.encoder_hidden_states, self.encoder_attention_mask)

    def index(self, rows: Tensor | list[int]) -> Self:
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        text = self.text().index(rows_t)
        return type(self)(text.encoder_hidden_states, text.encoder_attention_mask, self.source_latents[rows_t])

    @classmethod
    def cat(cls, states: Sequence[Self]) -> Self:
        text = MaskedTextState.cat([s.text() for s in states])
        source = torch.cat([s.source_latents for s in states])
        return cls(text.encoder_hidden_states, text.encoder_attention_mask, source)
