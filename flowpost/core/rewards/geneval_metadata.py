"""GenEval's prompt metadata: the objects an image must hold (``include``), may not hold (``exclude``), and the
task they test (``tag``), as GenEval's ``prompts/evaluation_metadata.jsonl`` writes them."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

COCO_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock",
    "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip
COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
RELATIONS = ("left of", "right of", "above", "below")
FIELDS = ("tag", "include")  # what every GenEval prompt's metadata holds; ``exclude`` is optional


@dataclass(frozen=True)
class Requirement:
    """``count`` objects of ``name``; in ``include``, optionally of ``color`` and ``position`` (a relation to
    the objects of the include entry at the given index)."""

    name: str
    count: int
    color: str | None = None
    position: tuple[str, int] | None = None


@dataclass(frozen=True)
class GenevalSpec:
    """One prompt's checks: every ``include`` requirement holds, and no ``exclude`` one does."""

    tag: str
    include: tuple[Requirement, ...]
    exclude: tuple[Requirement, ...]


def parse_geneval(metadata: dict[str, Any]) -> GenevalSpec:
    """The checks in a prompt's metadata; a missing or malformed field raises ``ValueError`` saying which."""
    for field in FIELDS:
        if field not in metadata:
            raise ValueError(f"GenEval metadata needs {field!r}; this row has {', '.join(map(repr, metadata))}")
    tag = metadata["tag"]
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"'tag' is {tag!r}; it names the task, e.g. 'counting'")
    include = _requirements(metadata["include"], "include")
    exclude = _requirements(metadata.get("exclude", []), "exclude")
    for index, requirement in enumerate(include):
        if requirement.position is not None and not 0 <= requirement.position[1] < index:
            raise ValueError(
                f"include.{index}.position refers to include entry {requirement.position[1]}; it must name an "
                "earlier entry"
            )
    return GenevalSpec(tag, include, exclude)


def _requirements(entries: Any, field: str) -> tuple[Requirement, ...]:
    if not isinstance(entries, list):
        raise ValueError(f"{field!r} is {entries!r}; write a list of {{class, count}} objects")
    return tuple(_requirement(entry, f"{field}.{index}", field == "include") for index, entry in enumerate(entries))


def _requirement(entry: Any, where: str, include: bool) -> Requirement:
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is {entry!r}; write an object with 'class' and 'count'")
    allowed = {"class", "count", "color", "position"} if include else {"class", "count"}
    if unknown := sorted(set(entry) - allowed):
        raise ValueError(f"{where} has unknown field {unknown[0]!r}; its fields are {', '.join(sorted(allowed))}")
    name = entry.get("class")
    if name not in COCO_CLASSES:
        raise ValueError(f"{where}.class is {name!r}, not one of GenEval's 80 COCO class names")
    count = _count(entry.get("count"), f"{where}.count")
    color = entry.get("color")
    if color is not None and color not in COLORS:
        raise ValueError(f"{where}.color is {color!r}; GenEval's colours are {', '.join(COLORS)}")
    return Requirement(name, count, color, _position(entry.get("position"), f"{where}.position"))


def _count(value: Any, where: str) -> int:
    try:
        count = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        count = None
    if count is None or count < 1:
        raise ValueError(f"{where} is {value!r}; write a positive integer")
    return count


def _position(value: Any, where: str) -> tuple[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2 or value[0] not in RELATIONS:
        raise ValueError(f"{where} is {value!r}; write [relation, index] with a relation among {', '.join(RELATIONS)}")
    if isinstance(value[1], bool) or not isinstance(value[1], int):
        raise ValueError(f"{where} index is {value[1]!r}; write the index of an earlier include entry")
    return value[0], value[1]
