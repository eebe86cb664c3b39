"""The condition states of the pipeline families: text token states with a pooled vector (the MMDiT
families) or with a padding mask (the families without a pooled vector: qwen-image, wan2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState


@dataclass
class TextState(ConditionState):
    """Token states and pooled vector as the MMDiT transformers (SD3, FLUX) consume them."""

    encoder_hidden_states: Tensor
    pooled_projections: Tensor

    def __len__(self) -> int:
        return int(self.encoder_hidden_states.shape[0])

    def index(self, rows: Tensor | list[int]) -> Self:
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        return type(self)(self.encoder_hidden_states[rows_t], self.pooled_projections[rows_t])

    @classmethod
    def cat(cls, states: Sequence[Self]) -> Self:
        return cls(
            torch.cat([s.encoder_hidden_states for s in states]),
            torch.cat([s.pooled_projections for s in states]),
        )


@dataclass
class MaskedTextState(ConditionState):
    """Token states ``[B, L, D]`` and their mask ``[B, L]`` (1 = real token, 0 = padding).

    Rows of different lengths pad to the longest on ``cat``; ``mask()`` is ``None`` when nothing is
    padded, as the stock pipelines pass it then. ``from_batch`` drops the columns that are padding in
    every row (qwen-image); a family whose transformer reads the padded states whole (wan2) builds the
    state from the cached rows as they are.
    """

    encoder_hidden_states: Tensor
    encoder_attention_mask: Tensor

    @classmethod
    def from_batch(cls, batch: ConditionBatch) -> Self:
        """The cached rows without the positions that are padding in every row."""
        real = batch.token_mask.bool()
        length = int(real.any(dim=0).nonzero().max()) + 1 if bool(real.any()) else 1
        return cls(batch.token_states[:, :length], real[:, :length])

    def __len__(self) -> int:
        return int(self.encoder_hidden_states.shape[0])

    def mask(self) -> Tensor | None:
        """The boolean padding mask, or ``None`` when every position is a real token."""
        return None if bool(self.encoder_attention_mask.all()) else self.encoder_attention_mask

    def index(self, rows: Tensor | list[int]) -> Self:
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        return type(self)(self.encoder_hidden_states[rows_t], self.encoder_attention_mask[rows_t])

    @classmethod
    def cat(cls, states: Sequence[Self]) -> Self:
        length = max(s.encoder_hidden_states.shape[1] for s in states)
        return cls(
            torch.cat([_padded(s.encoder_hidden_states, length) for s in states]),
            torch.cat([_padded(s.encoder_attention_mask, length) for s in states]),
        )


def _padded(rows: Tensor, length: int) -> Tensor:
    """``rows`` zero-padded along dimension 1 to ``length``."""
    shape = list(rows.shape)
    shape[1] = length - shape[1]
    return torch.cat([rows, rows.new_zeros(shape)], dim=1)
