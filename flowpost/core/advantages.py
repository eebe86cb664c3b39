"""Advantages from scalar rewards: group-normalised (GRPO), per reward then combined (GDPO), and per-prompt
running stats (DDPO).

Every function is pure on tensors; one advantage per sample is broadcast to its trajectory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import Tensor


def _check_batch(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.ndim != 1 or rewards.numel() == 0:
        raise ValueError(f"rewards must be a non-empty 1-D tensor, got shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} differs from rewards {tuple(rewards.shape)}")
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be integers, got {group_ids.dtype}")


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Each sample's dense group index [N] and the number of groups."""
    unique, index = torch.unique(group_ids, return_inverse=True)
    return index, unique.numel()


def _constant_groups(values: Tensor, index: Tensor, groups: int) -> Tensor:
    """[G] bool: groups whose rewards are all equal (zero std; size-1 groups included)."""
    low = values.new_full((groups,), float("inf")).scatter_reduce(0, index, values, "amin")
    high = values.new_full((groups,), float("-inf")).scatter_reduce(0, index, values, "amax")
    return low == high


def _output_dtype(rewards: Tensor) -> torch.dtype:
    return rewards.dtype if rewards.is_floating_point() else torch.float32


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std: Literal["group", "global"] = "group",
    eps: float = 1e-4,
    clip: float | None = 5.0,
) -> Tensor:
    """``A_i = (r_i - mean_g(i)) / (std + eps)``, clipped to ``±clip``.

    Groups are keyed by ``group_ids`` (any order, any size >= 1), never by prompt. ``std`` is the
    population std (ddof 0) of the sample's group or of all rewards. Samples of a group whose
    rewards are all equal (including size-1 groups) get exactly 0.
    """
    _check_batch(rewards, group_ids)
    if std not in ("group", "global"):
        raise ValueError(f"std must be 'group' or 'global', got {std!r}")
    values = rewards.detach().double()
    index, groups = _group_index(group_ids)
    zeros = values.new_zeros(groups)
    counts = zeros.index_add(0, index, torch.ones_like(values))
    means = zeros.index_add(0, index, values) / counts
    centred = values - means[index]
    if std == "group":
        scale = (zeros.index_add(0, index, centred.square()) / counts).sqrt()[index]
    else:
        scale = values.std(correction=0)
    advantages = centred / (scale + eps)
    advantages = torch.where(_constant_groups(values, index, groups)[index], 0.0, advantages)
    if clip is not None:
        advantages = advantages.clamp(-clip, clip)
    return advantages.to(_output_dtype(rewards))


def per_reward_advantages(
    components: Sequence[tuple[Tensor, float]],
    group_ids: Tensor,
    *,
    std: Literal["group", "global"] = "group",
    eps: float = 1e-4,
    clip: float | None = 5.0,
) -> Tensor:
    """GDPO: each reward normalised on its own, weighted, summed, then rescaled over the batch; clipped to ``±clip``.

    ``A_k`` = :func:`group_advantages` of reward ``k`` (unclipped), ``S = sum_k w_k A_k``,
    ``A = S / (std(S) + eps)`` with the population std of the whole batch. Each ``A_k`` has zero mean in
    every group, so ``S`` has zero batch mean and GDPO's batch centring changes nothing: rows of groups
    constant in every reward stay exactly 0. ``components`` are ``(scores [N], weight)`` pairs.
    """
    if not components:
        raise ValueError("per-reward advantages need at least one reward")
    first = components[0][0]
    total = torch.zeros_like(first, dtype=torch.float64)
    for scores, weight in components:
        total = total + weight * group_advantages(scores, group_ids, std=std, eps=eps, clip=None).double()
    advantages = total / (total.std(correction=0) + eps)
    if clip is not None:
        advantages = advantages.clamp(-clip, clip)
    return advantages.to(_output_dtype(first))


def reward_correlations(components: dict[str, Tensor], group_ids: Tensor, advantages: Tensor) -> dict[str, float]:
    """Each reward's share in steering the update: the Pearson correlation of the advantages with the reward's
    scores centred in their groups (0 where either is constant)."""
    index, groups = _group_index(group_ids)
    steer = advantages.detach().double()
    steer = steer - steer.mean()
    correlations: dict[str, float] = {}
    for name, scores in components.items():
        values = scores.detach().double()
        counts = values.new_zeros(groups).index_add(0, index, torch.ones_like(values))
        centred = values - (values.new_zeros(groups).index_add(0, index, values) / counts)[index]
        scale = (centred.square().sum() * steer.square().sum()).sqrt()
        correlations[name] = float((centred * steer).sum() / scale) if bool(scale > 0) else 0.0
    return correlations


def zero_advantage_fraction(advantages: Tensor) -> float:
    """The fraction of samples whose advantage is exactly 0 (what Flow-GRPO drops before the loss)."""
    return float((advantages.detach() == 0).double().mean())


@dataclass(frozen=True)
class AdvantageStats:
    """Summary of one batch of rewards and the advantages computed from them."""

    zero_std_ratio: float
    zero_fraction: float
    reward_mean: float
    reward_std: float
    advantage_abs_mean: float
    clipped_fraction: float

    @classmethod
    def from_batch(
        cls, rewards: Tensor, group_ids: Tensor, advantages: Tensor, *, clip: float | None = 5.0
    ) -> AdvantageStats:
        """Statistics of a batch; ``clipped_fraction`` counts ``|A| >= clip`` (0 without a clip)."""
        _check_batch(rewards, group_ids)
        values = rewards.detach().double()
        index, groups = _group_index(group_ids)
        magnitudes = advantages.detach().double().abs()
        clipped = float((magnitudes >= clip).double().mean()) if clip is not None else 0.0
        return cls(
            zero_std_ratio=float(_constant_groups(values, index, groups).double().mean()),
            zero_fraction=zero_advantage_fraction(advantages),
            reward_mean=float(values.mean()),
            reward_std=float(values.std(correction=0)),
            advantage_abs_mean=float(magnitudes.mean()),
            clipped_fraction=clipped,
        )


def advantage_metrics(
    rewards: Tensor, group_ids: Tensor, advantages: Tensor, *, clip: float | None = 5.0
) -> dict[str, float]:
    """:class:`AdvantageStats` of a batch as a flat metrics dict."""
    return asdict(AdvantageStats.from_batch(rewards, group_ids, advantages, clip=clip))


class PromptTracker:
    """DDPO per-prompt advantages from FIFO reward buffers that persist across calls.

    Each call first appends the batch's rewards to their prompts' buffers (at most
    ``buffer_size`` values each); a prompt with fewer than ``min_count`` buffered values is
    normalised with the whole batch's mean and population std instead of its buffer's.
    """

    def __init__(
        self,
        *,
        buffer_size: int = 16,
        min_count: int = 16,
        eps: float = 1e-6,
        clip: float | None = 5.0,
    ) -> None:
        if buffer_size < 1 or not 1 <= min_count <= buffer_size:
            raise ValueError(
                f"need 1 <= min_count <= buffer_size, got min_count={min_count}, buffer_size={buffer_size}"
            )
        self.buffer_size = buffer_size
        self.min_count = min_count
        self.eps = eps
        self.clip = clip
        self.buffers: dict[str, deque[float]] = {}

    def update(self, prompts: list[str], rewards: Tensor) -> Tensor:
        """Record ``rewards`` [N] under ``prompts`` and return their advantages [N]."""
        if rewards.ndim != 1 or rewards.numel() == 0 or len(prompts) != rewards.numel():
            raise ValueError(f"need one reward per prompt, got {len(prompts)} prompts and shape {tuple(rewards.shape)}")
        values = rewards.detach().double().cpu()
        batch_mean, batch_std = values.mean(), values.std(correction=0)
        rows_of: dict[str, list[int]] = {}
        for row, prompt in enumerate(prompts):
            rows_of.setdefault(prompt, []).append(row)
        advantages = torch.empty_like(values)
        for prompt, rows in rows_of.items():
            buffer = self.buffers.setdefault(prompt, deque(maxlen=self.buffer_size))
            buffer.extend(values[rows].tolist())
            if len(buffer) < self.min_count:
                mean, std = batch_mean, batch_std
            else:
                history = torch.tensor(list(buffer), dtype=torch.float64)
                mean, std = history.mean(), history.std(correction=0)
            advantages[rows] = (values[rows] - mean) / (std + self.eps)
        if self.clip is not None:
            advantages = advantages.clamp(-self.clip, self.clip)
        return advantages.to(device=rewards.device, dtype=_output_dtype(rewards))

    def state_dict(self) -> dict[str, Any]:
        """The buffers, JSON-serialisable."""
        return {"buffers": {prompt: list(buffer) for prompt, buffer in self.buffers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore buffers from :meth:`state_dict` (each keeps its newest ``buffer_size`` values)."""
        buffers = state.get("buffers")
        if not isinstance(buffers, dict):
            raise ValueError("prompt tracker state needs a 'buffers' mapping")
        self.buffers = {
            str(prompt): deque((float(value) for value in values), maxlen=self.buffer_size)
            for prompt, values in buffers.items()
        }
