"""The ``evaluate:`` section: metrics from the registry, seeds, and the judge-is-not-the-reward warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from flowpost.core.config.loading import judge_reward_warnings, load_pipeline
from flowpost.errors import FlowpostError

FOLDER_SFT = Path(__file__).resolve().parents[3] / "examples" / "folder-sft.yaml"


def _error(overrides: list[str], path: Path | None = None) -> str:
    with pytest.raises(FlowpostError) as info:
        load_pipeline(path, overrides)
    return str(info.value)


def test_the_digits_default_is_the_judge_the_reward_classifier_and_the_judge_fd() -> None:
    evaluate = load_pipeline(None).evaluate
    assert [(m.name, m.result_key) for m in evaluate.metrics] == [
        ("adherence", "adherence"),
        ("digit_adherence", "reward_mean"),
        ("fd", "fd"),
    ]
    assert evaluate.noise_seeds() == [1234]
    assert load_pipeline(None, ["evaluate.seeds=[3, 4]"]).evaluate.noise_seeds() == [3, 4]


def test_metrics_may_be_names_or_entries_with_options_and_a_key() -> None:
    evaluate = load_pipeline(
        None, ["evaluate.metrics=[brightness, {name: dark_fraction, key: dark, options: {threshold: 0.2}}]"]
    ).evaluate
    assert [(m.name, m.result_key, m.options) for m in evaluate.metrics] == [
        ("brightness", "brightness", {}),
        ("dark_fraction", "dark", {"threshold": 0.2}),
    ]


def test_an_unknown_metric_names_its_entry_and_the_closest_known_name() -> None:
    message = _error(["evaluate.metrics=[adherence, brightnes]"])
    assert "evaluate.metrics.1: unknown metric 'brightnes' (did you mean 'brightness'?)" in message
    assert "known metrics:" in message and "clip_score" in message and "fd_dinov2" in message


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("evaluate.seeds=[1, 1]", "evaluate.seeds: a seed is listed twice"),
        ("evaluate.seeds=[]", "evaluate.seeds: List should have at least 1 item"),
        ("evaluate.metrics=[fd, {name: brightness, key: fd}]", "evaluate.metrics: fd is listed twice"),
        ("evaluate.metrics=[{name: brightness, key: step}]", "step is a field of metrics.json already"),
        ("evaluate.metrics=[{name: brightness, options: {x: .nan}}]", "is not a finite number"),
    ],
)
def test_bad_seeds_and_metric_lists_name_the_path(override: str, problem: str) -> None:
    assert problem in _error([override])


def test_digit_classifier_metrics_need_a_digits_dataset() -> None:
    message = _error(["evaluate.after=[sft]", "evaluate.metrics=[brightness, adherence]"], FOLDER_SFT)
    assert "evaluate.metrics.1: 'adherence' reads the assets its dataset's acquisition writes (assets_dir)" in message
    assert "the source of evaluate.dataset 'shapes' writes none" in message


def test_an_image_dataset_needs_metrics_and_a_held_out_split() -> None:
    assert "evaluate.metrics: name the metrics for dataset 'shapes'" in _error(["evaluate.metrics=null"], FOLDER_SFT)
    message = _error(["datasets.shapes.split.eval=0"], FOLDER_SFT)
    assert "evaluate.dataset: dataset 'shapes' holds nothing out; set datasets.shapes.split.eval" in message


def test_a_stage_trained_on_the_headline_metric_warns_at_load() -> None:
    assert judge_reward_warnings(load_pipeline(None)) == []  # the judge leads, the reward classifier trains
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("flowpost")
    logger.addHandler(handler)
    try:
        pipeline = load_pipeline(None, ["evaluate.metrics=[digit_adherence, adherence]"])
    finally:
        logger.removeHandler(handler)
    warnings = judge_reward_warnings(pipeline)
    assert len(warnings) == 1 and warnings[0].startswith("stages.grpo.rewards.0: stage 'grpo' is trained on")
    assert "headline evaluation metric (evaluate.metrics.0)" in warnings[0]
    assert [r.levelno for r in records] == [logging.WARNING] and warnings[0] in records[0].getMessage()
