"""GenEval's checks on one image's detections: which detections count, the relative position of two objects,
GenEval's pass/fail verdict and Flow-GRPO's partial score.

Boxes are ``(x0, y0, x1, y1)`` in pixels. Colours come from ``classify(boxes, name)``, one colour name per box.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor

from flowpost.core.rewards.geneval_metadata import GenevalSpec

Box = tuple[float, float, float, float]
ColourClassifier = Callable[[list[Box], str], list[str]]


@dataclass(frozen=True)
class Thresholds:
    """GenEval's defaults: a detection counts above ``threshold`` (``counting_threshold`` for the counting
    task); at most ``max_objects`` per class; boxes overlapping a kept one by ``max_overlap`` IoU or more are
    dropped (1.0 keeps all); objects closer than ``position_threshold`` times their summed sizes have no
    relative position."""

    threshold: float = 0.3
    counting_threshold: float = 0.9
    max_objects: int = 16
    max_overlap: float = 1.0
    position_threshold: float = 0.1


def iou(a: Box, b: Box) -> float:
    """Intersection over union with GenEval's inclusive pixel convention (a box spans ``x1 - x0 + 1`` pixels)."""

    def area(box: Sequence[float]) -> float:
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))
    union = area(a) + area(b) - inter
    return inter / union if union else 0.0


def class_detections(result: dict[str, Tensor], classes: dict[int, str]) -> dict[str, list[tuple[float, Box]]]:
    """The ``(score, box)`` detections of each class named in ``classes`` (by label id), from one image's
    ``{"scores", "labels", "boxes"}`` as an image processor's ``post_process_object_detection`` returns them."""
    found: dict[str, list[tuple[float, Box]]] = {}
    for score, label, box in zip(result["scores"], result["labels"], result["boxes"], strict=True):
        if (name := classes.get(int(label))) is not None:
            x0, y0, x1, y1 = (float(v) for v in box)
            found.setdefault(name, []).append((float(score), (x0, y0, x1, y1)))
    return found


def kept_objects(
    detections: dict[str, list[tuple[float, Box]]], tag: str, thresholds: Thresholds
) -> dict[str, list[Box]]:
    """Per class, the boxes of its ``(score, box)`` detections that count, most confident first."""
    threshold = thresholds.counting_threshold if tag == "counting" else thresholds.threshold
    kept: dict[str, list[Box]] = {}
    for name, found in detections.items():
        ranked = sorted((d for d in found if d[0] > threshold), key=lambda d: -d[0])[: thresholds.max_objects]
        boxes: list[Box] = []
        for _, box in ranked:
            if thresholds.max_overlap == 1 or all(iou(other, box) < thresholds.max_overlap for other in boxes):
                boxes.append(box)
        if boxes:
            kept[name] = boxes
    return kept


def relative_position(a: Box, b: Box, threshold: float) -> set[str]:
    """Where ``a`` lies relative to ``b``: the centre offset, shrunk by ``threshold`` times the boxes' summed
    width (height), must point more than 60 degrees from the other axis; none when they nearly coincide."""
    centre_a, centre_b = ((a[0] + a[2]) / 2, (a[1] + a[3]) / 2), ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2)
    size = (abs(a[2] - a[0]) + abs(b[2] - b[0]), abs(a[3] - a[1]) + abs(b[3] - b[1]))
    offset = (centre_a[0] - centre_b[0], centre_a[1] - centre_b[1])
    revised = [
        max(abs(o) - threshold * s, 0) * math.copysign(1, o) if o else 0.0 for o, s in zip(offset, size, strict=True)
    ]
    if all(abs(r) < 1e-3 for r in revised):
        return set()
    dx, dy = (r / math.hypot(*offset) for r in revised)
    relations = {"left of": dx < -0.5, "right of": dx > 0.5, "above": dy < -0.5, "below": dy > 0.5}
    return {name for name, holds in relations.items() if holds}


def _all_placed(found: list[Box], targets: list[Box], relation: str, threshold: float) -> bool:
    return all(relation in relative_position(box, target, threshold) for box in found for target in targets)


def geneval_correct(
    spec: GenevalSpec, objects: dict[str, list[Box]], classify: ColourClassifier, position_threshold: float
) -> bool:
    """GenEval's verdict: each include entry finds at least ``count`` objects (its most confident ``count`` of
    the colour and in the position asked), and no exclude entry finds ``count`` or more."""
    groups: list[list[Box] | None] = []
    correct = True
    for requirement in spec.include:
        found = objects.get(requirement.name, [])[: requirement.count]
        matched = len(found) >= requirement.count
        if matched and requirement.color is not None:
            matched = classify(found, requirement.name).count(requirement.color) >= requirement.count
        if matched and requirement.position is not None:
            relation, index = requirement.position
            targets = groups[index]
            matched = targets is not None and _all_placed(found, targets, relation, position_threshold)
        groups.append(found if matched else None)
        correct = correct and matched
    return correct and all(len(objects.get(r.name, [])) < r.count for r in spec.exclude)


def partial_score(
    spec: GenevalSpec, objects: dict[str, list[Box]], classify: ColourClassifier, position_threshold: float
) -> float:
    """Flow-GRPO's training score: the mean of one term per include entry for its count,
    ``max(1 - |count - found| / count, 0)``, and, when it asks for a colour or a position, one more term:
    0 unless exactly ``count`` objects were found, else the fraction of them of the colour asked (a position
    asked after a colour that failed adds none) or 1 if all are in the position asked, else 0. Excludes are
    not scored; no include entry scores 0."""
    groups: list[list[Box] | None] = []
    terms: list[float] = []
    for requirement in spec.include:
        found = objects.get(requirement.name, [])
        count = requirement.count
        terms.append(max(1 - abs(count - len(found)) / count, 0.0))
        matched = len(found) == count
        if not matched:
            if requirement.color is not None or requirement.position is not None:
                terms.append(0.0)
        else:
            if requirement.color is not None:
                coloured = classify(found, requirement.name).count(requirement.color)
                terms.append(1 - abs(count - coloured) / count)
                matched = coloured == count
            if requirement.position is not None and matched:
                relation, index = requirement.position
                targets = groups[index]
                matched = targets is not None and _all_placed(found, targets, relation, position_threshold)
                terms.append(float(matched))
        groups.append(found if matched else None)
    return sum(terms) / len(terms) if terms else 0.0
