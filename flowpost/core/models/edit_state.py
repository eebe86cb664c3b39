"""The condition states of the edit families: the instruction's text state and the source images' packed latents
with their patch grids, either beside a padding mask (qwen-image-edit, -plus) or beside a pooled vector
(flux1-kontext)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.models.text_state import MaskedTextState, TextState


def source_tokens(flat: Tensor, channels: int, sources: int = 1) -> Tensor:
    """Cached rows of flattened source latents as ``[B, S, channels]`` tokens of ``sources`` square grids one after
    another, or refused."""
    values = flat.shape[1]
    grid = values // (channels * sources)
    if grid == 0 or grid * channels * sources != values or math.isqrt(grid) ** 2 != grid:
        grids = "square grid" if sources == 1 else f"{sources} square grids"
        raise ValueError(
            f"cached rows of {values} source values are no {grids} of {channels}-channel latent tokens; re-run the "
            "conditions node with this family's pipeline (and model.options.sources)"
        )
    return flat.reshape(len(flat), values // channels, channels)


def grid_side(source_latents: Tensor, sources: int = 1) -> int:
    """The side of each of the ``sources`` square grids of packed tokens ``[B, S, C]``."""
    return math.isqrt(int(source_latents.shape[1]) // sources)


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
        source = source_tokens(batch.pooled, channels, sources)
        return cls(text.encoder_hidden_states, text.encoder_attention_mask, source, sources)

    @property
    def source_grid(self) -> int:
        """The side of each source's square grid of packed tokens."""
        return grid_side(self.source_latents, self.sources)

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
