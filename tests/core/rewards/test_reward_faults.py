"""A reward that fails names its place in the pipeline (``stages.X.rewards.N``) and its name."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from flowpost.core.rewards.combine import WeightedRewards
from flowpost.errors import FlowpostError, TransientError

MEDIA, PROMPTS, METADATA = torch.zeros(2, 1, 4, 4), ["", ""], [{}, {}]


class Scripted:
    def __init__(self, name: str, answer: Any) -> None:
        self.name, self.answer = name, answer

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (torch.tensor([1.0, float("nan")]), "reward 'bad' returned 1 non-finite of 2 scores"),
        (torch.tensor([1.0, float("inf")]), "reward 'bad' returned 1 non-finite of 2 scores"),
        (torch.tensor([1.0, 2.0, 3.0]), r"reward 'bad' returned \(3,\), expected \(2,\) scores"),
        ([1.0, 2.0], r"reward 'bad' returned list, expected \(2,\) scores"),
        (ZeroDivisionError("division by zero"), "reward 'bad' raised ZeroDivisionError: division by zero"),
    ],
)
def test_a_failing_reward_is_named_by_its_config_path(answer: Any, message: str) -> None:
    rewards = WeightedRewards(
        [(Scripted("good", torch.ones(2)), 1.0), (Scripted("bad", answer), 1.0)], where="stages.grpo.rewards"
    )
    with pytest.raises(FlowpostError, match=message) as info:
        rewards(MEDIA, PROMPTS, METADATA)
    assert info.value.where == "stages.grpo.rewards.1"
    assert str(info.value).startswith("stages.grpo.rewards.1: ")


def test_a_transient_reward_failure_stays_retryable() -> None:
    rewards = WeightedRewards([(Scripted("remote", TransientError("timed out")), 1.0)], where="stages.grpo.rewards")
    with pytest.raises(TransientError, match="stages.grpo.rewards.0: reward 'remote': timed out"):
        rewards(MEDIA, PROMPTS, METADATA)
