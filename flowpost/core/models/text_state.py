"""The condition states of the pipeline families: text token states, with a pooled vector (MMDiT) or without."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionState


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
class TokenState(ConditionState):
    """Token states alone, as the cross-attention transformers (Wan) consume them."""

    encoder_hidden_states: Tensor

    def __len__(self) -> int:
        return int(self.encoder_hidden_states.shape[0])

    def index(self, rows: Tensor | list[int]) -> Self:
        return type(self)(self.encoder_hidden_states[torch.as_tensor(rows, dtype=torch.long)])

    @classmethod
    def cat(cls, states: Sequence[Self]) -> Self:
        return cls(torch.cat([s.encoder_hidden_states for s in states]))
