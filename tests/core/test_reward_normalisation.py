"""Per-reward (GDPO) advantages: each reward normalised in its group, weighted, summed, rescaled over the batch."""

from __future__ import annotations

import math

import pytest
import torch

from flowpost.core.advantages import group_advantages, per_reward_advantages, reward_correlations

EPS = 1e-4


def test_hand_computed_two_groups_two_rewards() -> None:
    groups = torch.tensor([0, 0, 1, 1])
    quality = torch.tensor([1.0, 3.0, 0.0, 4.0])  # group 0: mean 2, std 1; group 1: mean 2, std 2
    size = torch.tensor([10.0, 0.0, 5.0, 5.0])  # group 0: mean 5, std 5; group 1 constant: 0
    a_quality = [-1 / (1 + EPS), 1 / (1 + EPS), -2 / (2 + EPS), 2 / (2 + EPS)]
    a_size = [5 / (5 + EPS), -5 / (5 + EPS), 0.0, 0.0]
    summed = [q + 2 * s for q, s in zip(a_quality, a_size, strict=True)]  # weights 1 and 2
    batch_std = math.sqrt(sum(v * v for v in summed) / 4 - (sum(summed) / 4) ** 2)
    expected = torch.tensor([v / (batch_std + EPS) for v in summed])
    advantages = per_reward_advantages([(quality, 1.0), (size, 2.0)], groups)
    torch.testing.assert_close(advantages, expected)


def _independent_rewards(groups: int = 16, size: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    group_ids = torch.arange(groups).repeat_interleave(size)
    small = torch.rand(groups * size, generator=generator)  # in [0, 1]
    large = 100 * torch.rand(groups * size, generator=generator)  # 100 times the scale, independent
    return small, large, group_ids


def test_a_reward_with_a_hundred_times_the_scale_dominates_the_sum_but_not_per_reward() -> None:
    small, large, group_ids = _independent_rewards()
    components = {"small": small, "large": large}
    summed = group_advantages(small + large, group_ids)
    steering = reward_correlations(components, group_ids, summed)
    assert steering["large"] > 0.95 and abs(steering["small"]) < 0.1
    decoupled = per_reward_advantages([(small, 1.0), (large, 1.0)], group_ids)
    steering = reward_correlations(components, group_ids, decoupled)
    assert 0.55 < steering["small"] < 0.85 and 0.55 < steering["large"] < 0.85


def test_weights_apply_after_normalisation() -> None:
    small, large, group_ids = _independent_rewards()
    favoured = per_reward_advantages([(small, 3.0), (large, 1.0)], group_ids)
    steering = reward_correlations({"small": small, "large": large}, group_ids, favoured)
    assert steering["small"] > 0.9 and steering["large"] < 0.45


def test_a_single_reward_is_its_weighted_group_advantage_over_the_batch_std() -> None:
    rewards = torch.tensor([0.3, 0.9, 0.1, 2.0, 7.0, 4.0])
    group_ids = torch.tensor([1, 1, 1, 2, 2, 2])
    weighted = 0.5 * group_advantages(rewards, group_ids, clip=None).double()
    expected = weighted / (weighted.std(correction=0) + EPS)
    torch.testing.assert_close(per_reward_advantages([(rewards, 0.5)], group_ids), expected.float())


def test_global_std_normalises_each_reward_by_its_batch_std() -> None:
    first = torch.tensor([0.0, 2.0, 1.0, 5.0])
    second = torch.tensor([4.0, 0.0, 3.0, 3.0])
    group_ids = torch.tensor([0, 0, 1, 1])
    parts = [group_advantages(r, group_ids, std="global", clip=None).double() for r in (first, second)]
    summed = parts[0] + parts[1]
    expected = (summed / (summed.std(correction=0) + EPS)).float()
    torch.testing.assert_close(per_reward_advantages([(first, 1.0), (second, 1.0)], group_ids, std="global"), expected)


def test_groups_constant_in_every_reward_stay_exactly_zero_and_the_clip_applies_last() -> None:
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1] + [2] * 40)
    first = torch.tensor([0.5, 0.5, 0.5, 0.0, 1.0, 0.0] + [0.0] * 39 + [1.0])
    second = torch.tensor([2.0, 2.0, 2.0, 3.0, 3.0, 9.0] + [0.0] * 40)
    unclipped = per_reward_advantages([(first, 1.0), (second, 1.0)], group_ids, clip=None)
    assert unclipped[:3].tolist() == [0.0, 0.0, 0.0] and float(unclipped.abs().max()) > 3.0
    clipped = per_reward_advantages([(first, 1.0), (second, 1.0)], group_ids, clip=3.0)
    assert clipped[:3].tolist() == [0.0, 0.0, 0.0] and float(clipped.abs().max()) == 3.0
    torch.testing.assert_close(clipped, unclipped.clamp(-3.0, 3.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_advantages_take_the_rewards_dtype_and_device(dtype: torch.dtype) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rewards = torch.tensor([0.1, 0.7, 0.3, 0.2], dtype=dtype, device=device)
    group_ids = torch.tensor([0, 0, 1, 1], device=device)
    advantages = per_reward_advantages([(rewards, 1.0), (rewards.square(), 1.0)], group_ids)
    assert advantages.dtype == dtype and advantages.device == rewards.device


def test_bad_inputs_are_refused() -> None:
    group_ids = torch.tensor([0, 0])
    with pytest.raises(ValueError, match="at least one reward"):
        per_reward_advantages([], group_ids)
    with pytest.raises(ValueError, match="group_ids shape"):
        per_reward_advantages([(torch.zeros(2), 1.0), (torch.zeros(3), 1.0)], group_ids)


def test_a_constant_reward_steers_nothing() -> None:
    group_ids = torch.tensor([0, 0, 1, 1])
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    steering = reward_correlations({"flat": torch.ones(4), "same": advantages}, group_ids, advantages)
    assert steering["flat"] == 0.0 and steering["same"] == pytest.approx(1.0)
