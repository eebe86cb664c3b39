"""Optimizer steps with a non-finite loss or gradients: found on every rank together and counted."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from flowpost.core.distributed import any_over_ranks


def step_is_finite(loss: Tensor | float | None, parameters: list[nn.Parameter]) -> Tensor:
    """Whether this rank's ``loss`` and gradients hold no NaN or infinity (missing gradients count as
    finite), as a bool tensor left on their device: the loop reads it with the step's metrics."""
    finite = torch.tensor(True) if loss is None else torch.isfinite(torch.as_tensor(loss))
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads:
        gradients = torch.isfinite(torch.stack(torch._foreach_norm(grads)).sum())
        if torch.distributed.is_available():
            from torch.distributed.tensor import DTensor

            if isinstance(gradients, DTensor):  # a sharded layout's: this rank's view (ranks agree after)
                gradients = gradients.to_local()
        finite = finite & gradients  # a 0-dim host flag joins the device's
    return finite


class BadSteps:
    """Counts skipped steps: ``total`` over the stage, ``in_a_row`` since the last good one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.in_a_row = 0

    def is_bad(self, finite: bool, device: torch.device) -> bool:
        """Whether the step was not ``finite`` on any rank; updates the counts."""
        bad = any_over_ranks(not finite, device)
        self.total += bad
        self.in_a_row = self.in_a_row + 1 if bad else 0
        return bad

    @property
    def exhausted(self) -> bool:
        """``limit`` steps in a row were bad: the stage should stop."""
        return self.in_a_row >= self.limit
