"""Encoded prompts and the model-specific state prepared from them: data types, no flowpost imports."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import torch
from torch import Tensor

NULL_PROMPT = ""  # the unconditional (negative) prompt every condition cache holds


@dataclass
class ConditionBatch:
    """Encoded prompts as the condition cache stores them.

    ``token_states`` [B, L, D] and ``token_mask`` [B, L] (1 = real token) are the per-token
    encoder output; ``pooled`` [B, P] is the sentence vector (an edit family's: its source latents, flattened).
    """

    token_states: Tensor
    token_mask: Tensor
    pooled: Tensor

    def __len__(self) -> int:
        return int(self.token_states.shape[0])

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> ConditionBatch:
        return ConditionBatch(
            token_states=self.token_states.to(device=device, dtype=dtype),
            token_mask=self.token_mask.to(device=device),
            pooled=self.pooled.to(device=device, dtype=dtype),
        )

    def index(self, rows: Tensor | list[int]) -> ConditionBatch:
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        return ConditionBatch(
            token_states=self.token_states[rows_t],
            token_mask=self.token_mask[rows_t],
            pooled=self.pooled[rows_t],
        )

    @staticmethod
    def cat(batches: list[ConditionBatch]) -> ConditionBatch:
        return ConditionBatch(
            token_states=torch.cat([b.token_states for b in batches]),
            token_mask=torch.cat([b.token_mask for b in batches]),
            pooled=torch.cat([b.pooled for b in batches]),
        )


class ConditionState(ABC):
    """Model-specific condition tensors, prepared once per batch from a ``ConditionBatch``."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def index(self, rows: Tensor | list[int]) -> Self:
        """The rows ``rows`` of every tensor, in that order."""

    @classmethod
    @abstractmethod
    def cat(cls, states: Sequence[Self]) -> Self:
        """The states one after another along the batch dimension."""
