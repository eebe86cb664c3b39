"""MixGRPO: GRPO whose window of SDE steps slides over the trajectory as training proceeds; ODE elsewhere.

The window is ``sampling.window`` consecutive steps; its start runs over ``sampling.window_start``'s range
``[low, high]``: ``low`` for the first ``shift_interval`` iterations, then ``window_stride`` steps later
every ``shift_interval`` iterations, back to ``low`` once it would pass ``high`` (a pure function of the
iteration, so a resumed stage samples the same windows). Only the window's steps are stored and trained.
Outside it the sampler is deterministic: Euler, or (MixGRPO-Flash) DPM-Solver++(2M) on the steps after the
window, whose grid ``ode_compress`` may thin out.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.trainers.objective import Metrics
from flowpost.core.trainers.rl.grpo import GRPOArguments, GRPOTrainer
from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.core.trainers.rollout_engine import RolloutEngine
from flowpost.errors import FlowpostError


class MixGRPOArguments(GRPOArguments):
    """``train:`` of a MixGRPO stage; the window's size and range are ``sampling.window`` and ``window_start``."""

    window_stride: int = Field(
        1, ge=0, description="steps the window start moves every shift_interval iterations (0: it stays at low)"
    )
    shift_interval: int = Field(25, ge=1, description="rollout iterations between two moves of the window")
    ode_solver: Literal["euler", "dpm2"] = Field(
        "euler",
        description="the deterministic steps after the window: euler, or dpm2 (DPM-Solver++(2M), MixGRPO-Flash); "
        "the steps before the window are always Euler",
    )
    ode_compress: float = Field(
        1.0,
        gt=0,
        le=1,
        description="fraction of the grid points after the window kept (the model's own sigmas, evenly spread, "
        "at least one step to 0); 1: all; MixGRPO-Flash: 0.4",
    )

    def sampling_problems(self, sampling: SamplingConfig) -> list[str]:
        if sampling.window is None:
            return [
                "sampling.window: trainer 'mixgrpo' slides a window of that many SDE steps over the trajectory; "
                "set it (MixGRPO: 4 of 25 steps)"
            ]
        return []


def window_start(iteration: int, *, starts: tuple[int, int], stride: int, interval: int) -> int:
    """The first step of ``iteration``'s window: ``low + stride * (iteration // interval)``, rolled back to
    ``low`` past ``high`` (``starts = (low, high)``, inclusive)."""
    low, high = starts
    if stride == 0:
        return low
    positions = (high - low) // stride + 1
    return low + stride * ((iteration // interval) % positions)


def compressed_grid(sigmas: Tensor, stop: int, keep: float) -> Tensor:
    """``sigmas`` up to ``sigmas[stop]`` (the window's end), then ``max(int(keep * n), 2)`` of the ``n`` points
    from ``sigmas[stop]`` to the final one, evenly spread over their indices (both ends kept)."""
    last = len(sigmas) - 1
    points = max(int(keep * (last - stop + 1)), 2)
    if points >= last - stop + 1:
        return sigmas
    index = torch.linspace(stop, last, points, dtype=torch.float64).round().long()
    return torch.cat([sigmas[:stop], sigmas[index]])


class SlidingWindowEngine(RolloutEngine):
    """The rollout engine with MixGRPO's scheduled window, ODE solver and post-window grid."""

    args: MixGRPOArguments

    def __post_init__(self) -> None:
        if problems := self.args.sampling_problems(self.sampling):
            where, _, why = problems[0].partition(": ")
            raise FlowpostError(why, where=f"stages.{self.stage}.{where}")
        super().__post_init__()

    @property
    def ode_solver(self) -> str:
        return self.args.ode_solver

    def window(self, iteration: int) -> range:
        args = self.args
        start = window_start(
            iteration, starts=self.sampling.window_starts, stride=args.window_stride, interval=args.shift_interval
        )
        return range(start, start + self.sampling.window_size)

    def grid(self, window: range) -> Tensor:
        return compressed_grid(super().grid(window), window.stop, self.args.ode_compress)


class MixGRPOTrainer(GRPOTrainer):
    """GRPO on the steps of the sliding window; the loss is GRPO's."""

    Arguments = MixGRPOArguments
    args: MixGRPOArguments
    engine = SlidingWindowEngine

    def optimize(self, samples: Rollout) -> Metrics:
        metrics = super().optimize(samples)
        metrics["window/start"] = float(samples.steps[0])
        return metrics
