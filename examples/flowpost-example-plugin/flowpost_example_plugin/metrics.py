"""The ``sharpness`` metric: how much fine detail the samples hold."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from flowpost_example_plugin.images import luma

if TYPE_CHECKING:
    from flowpost.core.evaluation.samples import EvalSamples

LAPLACIAN = ((0.0, 1.0, 0.0), (1.0, -4.0, 1.0), (0.0, 1.0, 0.0))


class Sharpness:
    """The mean absolute response of the samples' luma to a 3x3 Laplacian (0 for flat images)."""

    name = "sharpness"

    def __call__(self, samples: EvalSamples) -> float:
        kernel = torch.tensor(LAPLACIAN, device=samples.images.device).view(1, 1, 3, 3)
        response = torch.nn.functional.conv2d(luma(samples.images).unsqueeze(1), kernel)
        return float(response.abs().mean())
