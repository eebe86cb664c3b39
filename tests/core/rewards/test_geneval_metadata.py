"""GenEval's metadata rows: parsed as GenEval writes them, and a malformed row named by its file and line when
the prompt files are read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowpost.core.rewards.geneval_metadata import Requirement, parse_geneval
from flowpost.data.prompt_files import read_prompt_files
from flowpost.errors import FlowpostError

# Rows of GenEval's prompts/evaluation_metadata.jsonl, one per task.
ROWS = [
    {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"},
    {
        "tag": "two_object",
        "include": [{"class": "toilet", "count": 1}, {"class": "computer mouse", "count": 1}],
        "prompt": "a photo of a toilet and a computer mouse",
    },
    {
        "tag": "counting",
        "include": [{"class": "clock", "count": 2}],
        "exclude": [{"class": "clock", "count": 3}],
        "prompt": "a photo of two clocks",
    },
    {
        "tag": "colors",
        "include": [{"class": "fire hydrant", "count": 1, "color": "blue"}],
        "prompt": "a photo of a blue fire hydrant",
    },
    {
        "tag": "position",
        "include": [{"class": "teddy bear", "count": 1}, {"class": "dog", "count": 1, "position": ["right of", 0]}],
        "prompt": "a photo of a dog right of a teddy bear",
    },
    {
        "tag": "color_attr",
        "include": [{"class": "pizza", "count": 1, "color": "red"}, {"class": "tie", "count": 1, "color": "green"}],
        "prompt": "a photo of a red pizza and a green tie",
    },
]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_geneval_rows_load_as_prompts_with_their_checks(tmp_path: Path) -> None:
    records = read_prompt_files(_write(tmp_path / "evaluation_metadata.jsonl", ROWS), where="datasets.geneval.path")
    assert [r.prompt for r in records.records] == [row["prompt"] for row in ROWS]
    for record, row in zip(records.records, ROWS, strict=True):
        assert record.metadata == {key: value for key, value in row.items() if key != "prompt"}
    counting, position = (parse_geneval(records.records[i].metadata) for i in (2, 4))
    assert counting.tag == "counting"
    assert counting.include == (Requirement("clock", 2),) and counting.exclude == (Requirement("clock", 3),)
    assert position.include[1] == Requirement("dog", 1, None, ("right of", 0))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tag": None}, "'tag' is None"),
        ({"include": {"class": "cup", "count": 1}}, "write a list"),
        ({"include": [{"class": "unicorn", "count": 1}]}, "include.0.class is 'unicorn'"),
        ({"include": [{"class": "cup", "count": 0}]}, "include.0.count is 0"),
        ({"include": [{"class": "cup", "count": "two"}]}, "include.0.count is 'two'"),
        ({"include": [{"class": "cup", "count": 1, "color": "teal"}]}, "include.0.color is 'teal'"),
        ({"include": [{"class": "cup", "count": 1, "position": ["left of", 0]}]}, "must name an earlier entry"),
        ({"include": [{"class": "cup", "count": 1}, {"class": "cat", "count": 1, "position": ["near", 0]}]}, "near"),
        ({"include": [{"class": "cup", "count": 1, "size": "big"}]}, "unknown field 'size'"),
        ({"exclude": [{"class": "cup", "count": 1, "color": "red"}]}, "unknown field 'color'"),
    ],
)
def test_a_malformed_row_is_named_by_file_and_line(tmp_path: Path, change: dict, message: str) -> None:
    bad = {**ROWS[0], **change}
    file = _write(tmp_path / "prompts.jsonl", [ROWS[1], bad])
    with pytest.raises(FlowpostError, match=message) as raised:
        read_prompt_files(file, where="datasets.geneval.path")
    assert raised.value.where == f"{file}:2"


def test_a_row_without_its_tag_is_refused(tmp_path: Path) -> None:
    file = _write(tmp_path / "prompts.jsonl", [{"include": [{"class": "cup", "count": 1}], "prompt": "a cup"}])
    with pytest.raises(FlowpostError, match="GenEval metadata needs 'tag'") as raised:
        read_prompt_files(file, where="datasets.geneval.path")
    assert raised.value.where == f"{file}:1"
