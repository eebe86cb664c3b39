"""``evaluate.every``: absent by default (the params stay as they were), else a multiple of each evaluated
stage's checkpoint cadence, with every checkpoint kept."""

from __future__ import annotations

import pytest

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict
from flowpost.errors import FlowpostError


def _error(overrides: list[str]) -> str:
    with pytest.raises(FlowpostError) as info:
        load_pipeline(None, overrides)
    return str(info.value)


def test_unset_it_stays_out_of_the_params_and_set_it_is_there() -> None:
    assert "every" not in pipeline_to_dict(load_pipeline(None))["evaluate"]
    pipeline = load_pipeline(None, ["evaluate.every=100"])  # sft checkpoints every 100 steps, grpo every 5
    assert pipeline.evaluate.every == 100 and pipeline_to_dict(pipeline)["evaluate"]["every"] == 100


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (
            ["evaluate.every=50"],
            "evaluate.every: 50 is not a multiple of stages.sft.train.checkpoint_every (100)",
        ),
        (
            ["evaluate.every=10", "stages.grpo.train.checkpoint_every=0", "stages.sft.train.checkpoint_every=10"],
            "evaluate.every: stage 'grpo' writes no checkpoints to score; set stages.grpo.train.checkpoint_every",
        ),
        (
            ["evaluate.every=100", "stages.grpo.train.keep_last=2"],
            "evaluate.every: stages.grpo.train.keep_last (2) deletes the checkpoints the evaluation scores",
        ),
        (["evaluate.every=0"], "evaluate.every: Input should be greater than or equal to 1"),
        (
            ["evaluate.every=100", "stages.grpo.model.lora={rank: 4}"],
            "evaluate.every: stage 'grpo' trains LoRA adapters or several roles",
        ),
    ],
)
def test_a_cadence_the_checkpoints_cannot_serve_names_evaluate_every(overrides: list[str], problem: str) -> None:
    assert problem in _error(overrides)


def test_a_stage_not_evaluated_may_keep_few_checkpoints() -> None:
    pipeline = load_pipeline(None, ["evaluate.every=100", "evaluate.after=[sft]", "stages.grpo.train.keep_last=1"])
    assert pipeline.evaluate.every == 100
