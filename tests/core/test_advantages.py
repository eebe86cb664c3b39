from __future__ import annotations

import json
import math

import pytest
import torch

from flowpost.core.advantages import AdvantageStats, PromptTracker, advantage_metrics, group_advantages


def test_hand_computed_group_advantages() -> None:
    rewards = torch.tensor([1.0, 0.0, 3.0, 0.0, 6.0])
    group_ids = torch.tensor([7, 2, 7, 2, 2])
    eps = 1e-4
    s2, s7 = 2 * math.sqrt(2), 1.0  # population std of {0, 0, 6} and {1, 3}
    expected = torch.tensor([-1 / (s7 + eps), -2 / (s2 + eps), 1 / (s7 + eps), -2 / (s2 + eps), 4 / (s2 + eps)])
    torch.testing.assert_close(group_advantages(rewards, group_ids), expected)


def test_global_std_uses_all_rewards_but_group_means() -> None:
    rewards = torch.tensor([1.0, 0.0, 3.0, 0.0, 6.0])
    group_ids = torch.tensor([7, 2, 7, 2, 2])
    scale = math.sqrt(26 / 5) + 1e-4  # population std of all five rewards
    expected = torch.tensor([-1.0, -2.0, 1.0, -2.0, 4.0]) / scale
    torch.testing.assert_close(group_advantages(rewards, group_ids, std="global"), expected)


def test_repeated_prompts_in_different_groups_are_normalised_separately() -> None:
    # All four samples share the prompt "a cat"; the sampler gave them two group ids.
    rewards = torch.tensor([0.0, 1.0, 10.0, 12.0])
    advantages = group_advantages(rewards, torch.tensor([0, 0, 1, 1]), eps=0.0)
    torch.testing.assert_close(advantages, torch.tensor([-1.0, 1.0, -1.0, 1.0]))
    keyed_by_prompt = group_advantages(rewards, torch.zeros(4, dtype=torch.int64), eps=0.0)
    assert not torch.allclose(advantages, keyed_by_prompt)


def test_clipping() -> None:
    rewards = torch.zeros(51)
    rewards[0] = 1.0
    group_ids = torch.zeros(51, dtype=torch.int64)
    p = 1 / 51
    outlier = (1 - p) / (math.sqrt(p * (1 - p)) + 1e-4)
    assert outlier > 5
    assert group_advantages(rewards, group_ids, clip=None)[0].item() == pytest.approx(outlier, rel=1e-5)
    clipped = group_advantages(rewards, group_ids)
    assert clipped[0].item() == 5.0
    assert advantage_metrics(rewards, group_ids, clipped)["clipped_fraction"] == pytest.approx(1 / 51)
    assert group_advantages(rewards, group_ids, clip=2.0).abs().max().item() == 2.0


def test_size_one_and_zero_std_groups_get_exact_zeros() -> None:
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.2, 0.4])
    group_ids = torch.tensor([3, 3, 3, 9, 5, 5])
    for std in ("group", "global"):
        advantages = group_advantages(rewards, group_ids, std=std)
        assert torch.isfinite(advantages).all()
        assert advantages[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
        assert advantages[4].item() < 0 < advantages[5].item()
    metrics = advantage_metrics(rewards, group_ids, group_advantages(rewards, group_ids))
    assert metrics["zero_std_ratio"] == pytest.approx(2 / 3)
    assert metrics["zero_fraction"] == pytest.approx(4 / 6)  # samples, not groups


def test_zero_fraction_counts_every_exactly_zero_advantage() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 4.0, 4.0])  # the median of the first group is its mean
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    advantages = group_advantages(rewards, group_ids)
    assert advantages[1] == 0 and advantage_metrics(rewards, group_ids, advantages)["zero_fraction"] == 4 / 6


def test_permutation_invariance() -> None:
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=generator)
    group_ids = torch.randint(0, 5, (24,), generator=generator) * 11
    order = torch.randperm(24, generator=generator)
    for std in ("group", "global"):
        advantages = group_advantages(rewards, group_ids, std=std)
        torch.testing.assert_close(group_advantages(rewards[order], group_ids[order], std=std), advantages[order])


def test_metrics() -> None:
    rewards = torch.tensor([1.0, 3.0, 5.0, 5.0])
    group_ids = torch.tensor([0, 0, 1, 1])
    advantages = group_advantages(rewards, group_ids)
    metrics = advantage_metrics(rewards, group_ids, advantages)
    assert set(metrics) == set(AdvantageStats.__dataclass_fields__)
    assert metrics["zero_std_ratio"] == 0.5
    assert metrics["reward_mean"] == 3.5
    assert metrics["reward_std"] == pytest.approx(math.sqrt(2.75))
    assert metrics["advantage_abs_mean"] == pytest.approx(0.5 / (1 + 1e-4))
    assert metrics["clipped_fraction"] == 0.0


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="group_ids shape"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="integers"):
        group_advantages(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="std must be"):
        group_advantages(torch.zeros(3), torch.zeros(3, dtype=torch.int64), std="batch")  # type: ignore[arg-type]


def _normalise(values: list[float], batch: list[float], eps: float = 1e-6) -> torch.Tensor:
    reference = torch.tensor(batch, dtype=torch.float64)
    mean, std = reference.mean(), reference.std(correction=0)
    return ((torch.tensor(values, dtype=torch.float64) - mean) / (std + eps)).float()


def test_prompt_tracker_falls_back_to_the_batch_then_uses_its_buffer() -> None:
    tracker = PromptTracker(buffer_size=4, min_count=3)
    first = tracker.update(["a", "a", "b"], torch.tensor([1.0, 3.0, 5.0]))
    torch.testing.assert_close(first, _normalise([1.0, 3.0, 5.0], [1.0, 3.0, 5.0]))

    second = tracker.update(["a", "b"], torch.tensor([2.0, 9.0]))
    # "a" now has three buffered values {1, 3, 2}; "b" has two, so it uses the batch {2, 9}.
    torch.testing.assert_close(second, torch.cat([_normalise([2.0], [1, 3, 2]), _normalise([9.0], [2, 9])]))

    state = json.loads(json.dumps(tracker.state_dict()))
    resumed = PromptTracker(buffer_size=4, min_count=3)
    resumed.load_state_dict(state)

    third = tracker.update(["a", "a"], torch.tensor([10.0, 10.0]))
    # FIFO: the buffer keeps the newest four values of "a".
    assert list(tracker.buffers["a"]) == [3.0, 2.0, 10.0, 10.0]
    torch.testing.assert_close(third, _normalise([10.0, 10.0], [3, 2, 10, 10]))
    assert torch.equal(resumed.update(["a", "a"], torch.tensor([10.0, 10.0])), third)
    assert resumed.state_dict() == tracker.state_dict()


def test_prompt_tracker_rejects_bad_settings_and_state() -> None:
    with pytest.raises(ValueError, match="min_count"):
        PromptTracker(buffer_size=4, min_count=8)
    with pytest.raises(ValueError, match="one reward per prompt"):
        PromptTracker().update(["a"], torch.zeros(2))
    with pytest.raises(ValueError, match="buffers"):
        PromptTracker().load_state_dict({})
