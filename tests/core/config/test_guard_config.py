"""A stage's ``guard:``: strict fields, registered metrics, a cadence, held-out prompts, a judge that is
not the stage's reward; errors name ``stages.<stage>.guard.<key>``."""

from __future__ import annotations

import pytest

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict
from flowpost.core.config.schema import GuardConfig
from flowpost.core.trainers.inputs import StageInputs
from flowpost.core.trainers.spec import StageSpec
from flowpost.errors import FlowpostError
from flowpost.stage import build_guard

GUARD = "stages.grpo.guard"


def _error(overrides: list[str]) -> str:
    with pytest.raises(FlowpostError) as info:
        load_pipeline(None, overrides)
    return str(info.value)


def test_a_guard_reads_its_judge_drop_and_bands() -> None:
    pipeline = load_pipeline(
        None,
        [
            f"{GUARD}={{metric: adherence, max_drop: 0.05, bounds: {{brightness: {{max_change: 0.1}}, "
            "dark_fraction: {min: 0.5, options: {threshold: 0.2}}}}",
        ],
    )
    guard = pipeline.stages["grpo"].guard
    assert guard is not None and guard.metric is not None
    assert (guard.metric.name, guard.max_drop, guard.better, guard.every, guard.weights) == (
        "adherence",
        0.05,
        "higher",
        None,
        "ema",
    )
    assert guard.bounds["brightness"].max_change == 0.1
    assert guard.bounds["dark_fraction"].options == {"threshold": 0.2}
    assert pipeline_to_dict(pipeline)["stages"]["grpo"]["guard"]["max_drop"] == 0.05


def test_a_stage_without_a_guard_keeps_its_params() -> None:
    assert "guard" not in pipeline_to_dict(load_pipeline(None))["stages"]["grpo"]


@pytest.mark.parametrize(
    ("guard", "where", "problem"),
    [
        ("{metric: adherence}", GUARD, "metric and max_drop go together"),
        ("{bounds: {}}", GUARD, "a guard needs a metric with max_drop, or bounds"),
        ("{metric: adherence, max_drop: -0.1}", f"{GUARD}.max_drop", "greater than or equal to 0"),
        ("{metric: adherence, max_drop: 0.1, patience: 2}", f"{GUARD}.patience", "unknown key"),
        ("{bounds: {brightness: {}}}", f"{GUARD}.bounds.brightness", "give min, max or max_change"),
        ("{bounds: {brightness: {min: 0.6, max: 0.4}}}", f"{GUARD}.bounds.brightness", "swap them"),
        ("{metric: adherence, max_drop: 0.1, better: up}", f"{GUARD}.better", "'higher' or 'lower'"),
    ],
)
def test_a_malformed_guard_names_its_key(guard: str, where: str, problem: str) -> None:
    message = _error([f"{GUARD}={guard}"])
    assert where in message and problem in message


def test_an_unknown_guard_metric_names_its_entry() -> None:
    message = _error([f"{GUARD}={{metric: adherance, max_drop: 0.1, bounds: {{britness: {{max: 0.5}}}}}}"])
    assert f"{GUARD}.metric: unknown metric 'adherance' (did you mean 'adherence'?)" in message
    assert f"{GUARD}.bounds.britness: unknown metric 'britness'" in message


def test_a_guard_needs_a_cadence() -> None:
    no_checkpoints = "stages.grpo.train.checkpoint_every=0"
    message = _error([f"{GUARD}={{metric: adherence, max_drop: 0.1}}", no_checkpoints])
    assert f"{GUARD}.every: set it, or train.checkpoint_every" in message
    guard = load_pipeline(None, [f"{GUARD}={{metric: adherence, max_drop: 0.1, every: 3}}", no_checkpoints])
    assert guard.stages["grpo"].guard.every == 3


def test_the_judge_of_a_guard_is_not_the_stage_reward() -> None:
    message = _error([f"{GUARD}={{metric: digit_adherence, max_drop: 0.1}}"])
    assert f"{GUARD}.metric: 'digit_adherence' is the stage's reward" in message


@pytest.mark.parametrize(
    ("metric", "better"),
    [("adherence", "higher"), ("fd", "lower"), ("jpeg_compressibility", "higher"), ("brightness", "lower")],
)
def test_a_judge_takes_its_metrics_direction_unless_the_guard_gives_one(metric: str, better: str) -> None:
    given = ", better: lower" if metric == "brightness" else ""
    pipeline = load_pipeline(None, [f"{GUARD}={{metric: {metric}, max_drop: 0.1{given}}}"])
    assert pipeline_to_dict(pipeline)["stages"]["grpo"]["guard"]["better"] == better


def test_a_judge_without_a_direction_needs_better() -> None:
    message = _error([f"{GUARD}={{metric: brightness, max_drop: 0.1}}"])
    assert f"{GUARD}.better: 'brightness' declares no direction; give better: higher or lower" in message


def test_a_guard_of_bands_alone_leaves_better_out_of_its_params() -> None:
    pipeline = load_pipeline(None, [f"{GUARD}={{bounds: {{brightness: {{max_change: 0.1}}}}}}"])
    assert "better" not in pipeline_to_dict(pipeline)["stages"]["grpo"]["guard"]


def test_a_stage_refuses_a_judge_left_without_a_direction(tmp_path) -> None:
    config = GuardConfig.model_validate({"metric": "brightness", "max_drop": 0.1})
    spec = StageSpec(stage="grpo", seed=0, config={}, output_dir=str(tmp_path))
    with pytest.raises(FlowpostError, match=rf"{GUARD}\.better: the judge has no direction"):
        build_guard(config, spec, StageInputs(), every=1, unit="step")
