"""The condition states of the edit families: the instruction's text state and the source image's packed latents
with their patch grid, either beside a padding mask (qwen-image-edit) or beside a pooled vector (flux1-kontext)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.models.text_state import MaskedTextState, TextState


def source_tokens(flat: Tensor, channels: int) -> Tensor:
    """Cached rows of flattened source latents as ``[B, S, channels]`` tokens on a square grid, or refused."""
    tokens = flat.shape[1] // channels
    if tokens == 0 or tokens * channels != flat.shape[1] or math.isqrt(tokens) ** 2 != tokens:
        raise ValueError(
            f"cached rows of {flat.shape[1]} source values are no square grid of {channels}-channel "
            "latent tokens; re-run the conditions node with this family's pipeline"
        )
    return flat.reshape(len(flat), tokens, channels)


def grid_side(source_latents: Tensor) -> int:
    """The side of the square grid of packed tokens ``[B, S, C]``."""
    return math.isqrt(int(source_latents.shape[1]))


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
        return cls(text.encoder_hidden_states, text.encoder_attention_mask, source_tokens(batch.pooled, channels))

    @property
    def source_grid(self) -> int:
        """The side of the source's square grid of packed tokens."""
        return grid_side(self.source_latents)

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


@dataclass
class PooledEditState(TextState):
    """``TextState`` (token states and the pooled vector) plus ``source_latents`` ``[B, S, C]`` on a square grid.

    A cached row's ``pooled`` holds the text's pooled vector followed by the flattened source latents."""

    source_latents: Tensor

    @classmethod
    def from_edit_batch(cls, batch: ConditionBatch, *, pooled_width: int, channels: int) -> Self:
        """The first ``pooled_width`` values of each ``pooled`` row as the pooled vector, the rest as source tokens."""
        source = source_tokens(batch.pooled[:, pooled_width:], channels)
        return cls(batch.token_states, batch.pooled[:, :pooled_width], source)

    @property
    def source_grid(self) -> int:
        """The side of the source's square grid of packed tokens."""
        return grid_side(self.source_latents)

    def with_text(self, text: TextState) -> Self:
        """``text`` (one row, or one per row) read with these rows' sources: a negative of the same edits."""
        rows = len(self)
        hidden, pooled = text.encoder_hidden_states, text.pooled_projections
        if len(text) != rows:
            hidden, pooled = hidden.expand(rows, *hidden.shape[1:]), pooled.expand(rows, *pooled.shape[1:])
        return type(self)(hidden, pooled, self.source_latents)

    def index(self, rows: Tensor | list[int]) -> Self:
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        return type(self)(
            self.encoder_hidden_states[rows_t], self.pooled_projections[rows_t], self.source_latents[rows_t]
        )

    @classmethod
    def cat(cls, states: Sequence[Self]) -> Self:
        text = TextState.cat(states)
        return cls(text.encoder_hidden_states, text.pooled_projections, torch.cat([s.source_latents for s in states]))
