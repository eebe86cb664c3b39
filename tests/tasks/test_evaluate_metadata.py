"""An evaluation whose prompts lack a metadata field that a metric, or a reward the stage trained on, reads is
refused before sampling, naming the entry, the dataset, the prompt and the field."""

from __future__ import annotations

import pytest

from flowpost.core.config.schema import RewardConfig
from flowpost.core.config.schema.evaluation import EvaluateConfig
from flowpost.data.eval_split import EvalSplit
from flowpost.errors import FlowpostError
from flowpost.tasks.evaluate import check_evaluated_metadata

GENEVAL = {"name": "geneval", "options": {"detector": "unused", "clip": "unused"}}  # checked before building
CAT = {"tag": "single_object", "include": [{"class": "cat", "count": 1}]}


def _split(*metadata: dict) -> EvalSplit:
    return EvalSplit([f"prompt {i}" for i in range(len(metadata))], list(metadata), None)


def test_a_metric_reading_missing_metadata_is_refused() -> None:
    config = EvaluateConfig.model_validate({"metrics": ["saturation", GENEVAL], "dataset": "geneval_test"})
    with pytest.raises(
        FlowpostError, match="'include' of every prompt, and prompt 'prompt 1' of dataset 'geneval_test'"
    ) as raised:
        check_evaluated_metadata(
            config, stage="grpo", rewards=[], split=_split(CAT, {"tag": "x"}), dataset="geneval_test"
        )
    assert raised.value.where == "evaluate.metrics.1"
    check_evaluated_metadata(config, stage="grpo", rewards=[], split=_split(CAT, CAT), dataset="geneval_test")


def test_a_trained_reward_reading_missing_metadata_is_refused() -> None:
    config = EvaluateConfig.model_validate({"metrics": ["saturation"], "dataset": "test_prompts"})
    rewards = [RewardConfig(name="mean_brightness"), RewardConfig.model_validate(GENEVAL)]
    with pytest.raises(
        FlowpostError, match="'tag' of every prompt, and prompt 'prompt 0' of dataset 'test_prompts'"
    ) as raised:
        check_evaluated_metadata(config, stage="grpo", rewards=rewards, split=_split({}), dataset="test_prompts")
    assert raised.value.where == "stages.grpo.rewards.1"
    check_evaluated_metadata(config, stage="grpo", rewards=rewards[:1], split=_split({}), dataset="test_prompts")
