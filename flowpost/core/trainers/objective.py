"""The one loop contract: trainers hand the loop losses and metrics as tensors, the loop does the rest.

A dataset trainer's ``optimize_batch`` returns ``{"loss": scalar, ...metrics}``; a generation trainer's
micro-batch objective is an ``Objective``: it yields each part of its loss, already scaled, for the loop
to backpropagate before it builds the next part (the part's graph is freed in between), and returns the
micro-batch's metrics. The loop sums metrics detached on their device (``accumulate``) and reads them to
the host once per optimizer step (``to_host``), together with the step's finiteness check.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

import torch
from torch import Tensor

Metrics = dict[str, Tensor | float]  # scalar tensors left on their device, or host floats
Objective = Generator[Tensor, None, Metrics]


def accumulate(sums: Metrics, metrics: Mapping[str, Tensor | float], *, scale: float = 1.0, divisor: float = 1) -> None:
    """Add ``metrics * scale / divisor`` into ``sums``: a tensor detached, on its device (no sync), in
    float64 (the arithmetic of Python floats, so the sums are theirs bit for bit); a float on the host."""
    for key, value in metrics.items():
        term = value.detach().double() if isinstance(value, Tensor) else value
        if scale != 1.0:
            term = term * scale
        if divisor != 1:
            term = term / divisor
        sums[key] = sums.get(key, 0.0) + term


def to_host(values: Mapping[str, Tensor | float], flag: Tensor | None = None) -> tuple[dict[str, float], bool]:
    """``values`` as floats and ``flag`` as a bool (True without one): the tensors on each device come
    back in one copy, so a device costs one sync however many metrics there are."""
    tensors: list[tuple[str | None, Tensor]] = [(k, v) for k, v in values.items() if isinstance(v, Tensor)]
    if flag is not None:
        tensors.append((None, flag))
    by_device: dict[torch.device, list[tuple[str | None, Tensor]]] = {}
    for key, tensor in tensors:
        by_device.setdefault(tensor.device, []).append((key, tensor))
    read: dict[str | None, float] = {}
    for entries in by_device.values():
        stacked = torch.stack([tensor.detach().double().reshape(()) for _, tensor in entries])
        read.update(zip([key for key, _ in entries], stacked.tolist(), strict=True))
    host = {key: read[key] if key in read else float(value) for key, value in values.items()}
    return host, bool(read.get(None, 1.0))
