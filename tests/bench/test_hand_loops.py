"""The hand-written baselines of the benchmarks do flowpost's math."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from flowpost.core.sampling.sde import sde_step

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from hand_loops import flow_sde_transition, log_prob  # noqa: E402


@pytest.mark.parametrize("first", [True, False])
def test_the_baseline_flow_sde_step_is_flowposts(first: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    x, v, target = (torch.randn(3, 1, 4, 4, generator=generator) for _ in range(3))
    sigma = torch.tensor([1.0, 0.8, 0.5]) if first else torch.tensor([0.9, 0.6, 0.3])
    sigma_next = sigma - 0.1
    mean, std = flow_sde_transition(v, x, sigma, sigma_next, 0.7)
    reference = sde_step("flow-sde", v, x, sigma, sigma_next, noise_level=0.7, prev_sample=target)
    torch.testing.assert_close(mean, reference.mean)
    torch.testing.assert_close(std.expand_as(mean), reference.std.expand_as(mean))
    torch.testing.assert_close(log_prob(target, mean, std), reference.log_prob)
