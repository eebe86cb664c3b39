"""GenEval's checks on hand-built detections: which detections count, relative positions, GenEval's verdict and
Flow-GRPO's partial score."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.rewards.geneval_checks import (
    Box,
    Thresholds,
    class_detections,
    geneval_correct,
    iou,
    kept_objects,
    partial_score,
    relative_position,
)
from flowpost.core.rewards.geneval_metadata import parse_geneval

LEFT: Box = (0.0, 40.0, 20.0, 60.0)
RIGHT: Box = (80.0, 40.0, 100.0, 60.0)
TOP: Box = (40.0, 0.0, 60.0, 20.0)
THRESHOLD = Thresholds().position_threshold


def _colours(*colours: str):  # noqa: ANN202
    """A classifier naming ``colours`` for the boxes in order, and recording what it was asked."""
    asked: list[tuple[list[Box], str]] = []

    def classify(boxes: list[Box], name: str) -> list[str]:
        asked.append((boxes, name))
        return list(colours[: len(boxes)])

    classify.asked = asked  # type: ignore[attr-defined]
    return classify


def _post_processed(scores: list[float], labels: list[int], boxes: list[Box]) -> dict[str, torch.Tensor]:
    """One image's result as ``post_process_object_detection`` returns it."""
    return {"scores": torch.tensor(scores), "labels": torch.tensor(labels), "boxes": torch.tensor(boxes)}


def test_post_processed_detections_are_grouped_by_geneval_class_and_unknown_labels_dropped() -> None:
    result = _post_processed([0.9, 0.5, 0.95], [2, 0, 2], [LEFT, RIGHT, TOP])
    found = class_detections(result, {2: "cat", 5: "dog"})
    assert list(found) == ["cat"]
    assert [score for score, _ in found["cat"]] == pytest.approx([0.9, 0.95])
    assert found["cat"][1][1] == TOP


def test_kept_objects_threshold_rank_cap_and_suppress_overlaps() -> None:
    shifted: Box = (1.0, 40.0, 21.0, 60.0)  # IoU with LEFT above 0.9
    detections = {"cat": [(0.5, LEFT), (0.95, RIGHT), (0.3, TOP), (0.92, shifted)], "dog": [(0.2, TOP)]}
    assert kept_objects(detections, "two_object", Thresholds()) == {"cat": [RIGHT, shifted, LEFT]}  # 0.3 is out
    assert kept_objects(detections, "counting", Thresholds()) == {"cat": [RIGHT, shifted]}  # above 0.9 only
    assert kept_objects(detections, "colors", Thresholds(max_objects=1)) == {"cat": [RIGHT]}
    assert kept_objects(detections, "colors", Thresholds(max_overlap=0.5)) == {"cat": [RIGHT, shifted]}
    assert iou(LEFT, LEFT) == 1 and iou(LEFT, RIGHT) == 0


def test_relative_position_follows_the_centres_beyond_the_threshold() -> None:
    assert relative_position(LEFT, RIGHT, THRESHOLD) == {"left of"}
    assert relative_position(RIGHT, LEFT, THRESHOLD) == {"right of"}
    assert relative_position(TOP, LEFT, THRESHOLD) == {"above", "right of"}  # 45 degrees: both
    assert relative_position(LEFT, TOP, THRESHOLD) == {"below", "left of"}
    close: Box = (3.0, 40.0, 23.0, 60.0)  # centres 3 px apart, under 0.1 * (20 + 20)
    assert relative_position(close, LEFT, THRESHOLD) == set()
    assert relative_position(close, LEFT, 0.0) == {"right of"}


def test_counting_needs_at_least_count_and_the_exclude_caps_it() -> None:
    spec = parse_geneval(
        {"tag": "counting", "include": [{"class": "cup", "count": 2}], "exclude": [{"class": "cup", "count": 3}]}
    )
    for found, correct, partial in [(1, False, 0.5), (2, True, 1.0), (3, False, 0.5), (5, False, 0.0)]:
        objects = {"cup": [LEFT] * found}
        assert geneval_correct(spec, objects, _colours(), THRESHOLD) is correct
        assert partial_score(spec, objects, _colours(), THRESHOLD) == pytest.approx(partial)


def test_single_objects_pass_geneval_with_extras_but_lose_partial_score() -> None:
    spec = parse_geneval({"tag": "single_object", "include": [{"class": "dog", "count": 1}]})
    assert geneval_correct(spec, {"dog": [LEFT, RIGHT]}, _colours(), THRESHOLD)
    assert partial_score(spec, {"dog": [LEFT, RIGHT]}, _colours(), THRESHOLD) == 0.0
    assert not geneval_correct(spec, {"cat": [LEFT]}, _colours(), THRESHOLD)


def test_colour_checks_the_most_confident_objects_of_the_class() -> None:
    spec = parse_geneval({"tag": "colors", "include": [{"class": "car", "count": 2, "color": "red"}]})
    classify = _colours("red", "blue")
    assert not geneval_correct(spec, {"car": [LEFT, RIGHT, TOP]}, classify, THRESHOLD)
    assert classify.asked == [([LEFT, RIGHT], "car")]  # GenEval classifies the first `count` only
    assert geneval_correct(spec, {"car": [LEFT, RIGHT]}, _colours("red", "red"), THRESHOLD)
    assert partial_score(spec, {"car": [LEFT, RIGHT]}, _colours("red", "blue"), THRESHOLD) == pytest.approx(0.75)
    assert partial_score(spec, {"car": [LEFT]}, _colours("red"), THRESHOLD) == pytest.approx(0.25)  # count, 0


def test_position_is_relative_to_the_objects_of_the_earlier_entry() -> None:
    spec = parse_geneval(
        {
            "tag": "position",
            "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}],
        }
    )
    right = {"cat": [RIGHT], "dog": [LEFT]}
    wrong = {"cat": [LEFT], "dog": [RIGHT]}
    assert geneval_correct(spec, right, _colours(), THRESHOLD)
    assert partial_score(spec, right, _colours(), THRESHOLD) == 1.0
    assert not geneval_correct(spec, wrong, _colours(), THRESHOLD)
    assert partial_score(spec, wrong, _colours(), THRESHOLD) == pytest.approx(2 / 3)
    no_target = {"dog": [LEFT]}
    assert not geneval_correct(spec, no_target, _colours(), THRESHOLD)
    assert partial_score(spec, no_target, _colours(), THRESHOLD) == pytest.approx(1 / 3)  # 0 cat, 1 dog, 0 place


def test_colour_attributes_of_two_objects_score_each_entry() -> None:
    spec = parse_geneval(
        {
            "tag": "color_attr",
            "include": [{"class": "cup", "count": 1, "color": "green"}, {"class": "cat", "count": 1, "color": "red"}],
        }
    )

    def classify(boxes: list[Box], name: str) -> list[str]:
        return ["green" if name == "cup" else "blue"] * len(boxes)

    objects = {"cup": [LEFT], "cat": [RIGHT]}
    assert not geneval_correct(spec, objects, classify, THRESHOLD)
    assert partial_score(spec, objects, classify, THRESHOLD) == pytest.approx(3 / 4)
