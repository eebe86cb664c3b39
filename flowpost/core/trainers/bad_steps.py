"""Optimizer steps with a non-finite loss or gradients: found on every rank together and counted."""

from __future__ import annotations

import math

import torch
from torch import nn

from flowpost.core.distributed import any_over_ranks


def gradients_finite(parameters: list[nn.Parameter]) -> bool:
    """Whether this rank's gradients hold no NaN or infinity (missing gradients count as finite)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return True
    norms = torch._foreach_norm(grads)
    return bool(torch.isfinite(torch.stack(norms).sum()))


class BadSteps:
    """Counts skipped steps: ``total`` over the stage, ``in_a_row`` since the last good one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.in_a_row = 0

    def is_bad(self, loss: float | None, parameters: list[nn.Parameter], device: torch.device) -> bool:
        """Whether any rank's ``loss`` or gradients are non-finite; updates the counts."""
        local = (loss is not None and not math.isfinite(loss)) or not gradients_finite(parameters)
        bad = any_over_ranks(local, device)
        self.total += bad
        self.in_a_row = self.in_a_row + 1 if bad else 0
        return bad

    @property
    def exhausted(self) -> bool:
        """``limit`` steps in a row were bad: the stage should stop."""
        return self.in_a_row >= self.limit
