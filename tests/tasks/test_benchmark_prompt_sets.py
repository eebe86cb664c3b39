"""Benchmark prompt sets as evaluation datasets, in the files their references publish: Flow-GRPO's OCR
``test.txt`` (the text to render in double quotes), DrawBench's CSV (``Prompts``, ``Category``) and GenEval's
``evaluation_metadata.jsonl``. A malformed file, or a prompt ``ocr`` cannot score, is refused by ``flowpost
validate`` naming its file and line."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_main import Outcome, flowpost_main

from flowpost.data.prompt_files import read_prompt_files
from flowpost.errors import FlowpostError

REPO = Path(__file__).resolve().parents[2]
OCR_LINES = [  # as in Flow-GRPO's dataset/ocr/test.txt: one prompt a line, the text to render in quotes
    'A close-up of a sleek smartwatch on a wrist, the screen displaying "Step Goal Achieved" at dusk.',
    'A weathered journal page with the phrase "Lost City Near" written in faded ink.',
]
DRAWBENCH = 'Prompts,Category\nA red colored car.,Colors\n"A dog, then a cat.",Counting\nA blue colored dog.,Colors\n'
GENEVAL_ROWS = [
    {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
    {
        "tag": "two_object",
        "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}],
        "prompt": "a photo of a cat and a dog",
    },
]


def _pipeline(tiny_pipeline: Any, tmp_path: Path, name: str, text: str, metrics: list[Any]) -> Path:
    """The tiny folder pipeline evaluated with ``metrics`` on the benchmark file ``name`` holding ``text``."""
    bench = tmp_path / name
    bench.write_text(text)
    config = yaml.safe_load((REPO / "examples" / "folder-sft.yaml").read_text())
    config["datasets"]["shapes"]["path"] = str(REPO / "tests" / "data" / "folder")
    config["datasets"]["bench"] = {"source": "prompt-files", "path": str(bench)}
    config["conditions"]["minilm"]["datasets"].append("bench")
    sft = config["stages"]["sft"]
    sft["model"]["transformer"] = copy.deepcopy(tiny_pipeline()["stages"]["sft"]["model"]["transformer"])
    config["evaluate"].update(dataset="bench", metrics=metrics, compare_to_base=True)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _validate(path: Path) -> Outcome:
    return flowpost_main("validate", str(path))


def _refusal(outcome: Outcome) -> str:
    assert outcome.code == 1 and "Traceback" not in outcome.stdout + outcome.stderr, outcome
    return " ".join(outcome.stderr.split())


def test_drawbench_rows_give_their_prompt_and_category(tmp_path: Path) -> None:
    (tmp_path / "drawbench.csv").write_text(DRAWBENCH)
    records = read_prompt_files(tmp_path / "drawbench.csv", where="datasets.bench.path").records
    assert [(r.prompt, r.metadata) for r in records] == [
        ("A red colored car.", {"category": "Colors"}),
        ("A dog, then a cat.", {"category": "Counting"}),
        ("A blue colored dog.", {"category": "Colors"}),
    ]


def test_a_drawbench_row_without_its_category_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "drawbench.csv").write_text(DRAWBENCH + "A green bench.,\n")
    with pytest.raises(FlowpostError, match=r"drawbench\.csv:5: 'Category' is blank"):
        read_prompt_files(tmp_path / "drawbench.csv", where="datasets.bench.path")


def test_the_published_sets_validate_as_evaluation_datasets(tiny_pipeline, tmp_path: Path) -> None:
    geneval = {"name": "geneval", "options": {"detector": "unused", "clip": "unused"}}  # built when it runs
    sets = [
        ("test.txt", "\n".join(OCR_LINES) + "\n", ["ocr", "brightness"]),
        ("drawbench.csv", DRAWBENCH, ["jpeg_compressibility"]),
        ("evaluation_metadata.jsonl", "".join(json.dumps(row) + "\n" for row in GENEVAL_ROWS), [geneval]),
    ]
    for name, text, metrics in sets:
        folder = tmp_path / name.partition(".")[0]
        folder.mkdir()
        outcome = _validate(_pipeline(tiny_pipeline, folder, name, text, metrics))
        assert outcome.code == 0, (name, outcome.stderr)


def test_an_ocr_prompt_without_quoted_text_is_refused_naming_file_and_line(tiny_pipeline, tmp_path: Path) -> None:
    text = "\n".join([OCR_LINES[0], "", "A neon sign over a diner at night."]) + "\n"
    message = _refusal(_validate(_pipeline(tiny_pipeline, tmp_path, "test.txt", text, ["brightness", "ocr"])))
    assert f"evaluate.metrics.1: {tmp_path / 'test.txt'}:3: ocr scores the text in double quotes" in message
    assert "'A neon sign over a diner at night.'" in message
    ok = _pipeline(tiny_pipeline, tmp_path, "test.txt", text, ["brightness"])  # nothing reads the quotes
    assert _validate(ok).code == 0


def test_a_malformed_benchmark_file_is_refused_at_validate_time(tiny_pipeline, tmp_path: Path) -> None:
    bad = DRAWBENCH + "A green bench.,\n"
    message = _refusal(_validate(_pipeline(tiny_pipeline, tmp_path, "drawbench.csv", bad, ["brightness"])))
    assert f"{tmp_path / 'drawbench.csv'}:5: 'Category' is blank" in message
    row = {"tag": "single_object", "include": [{"class": "cat", "count": "one"}], "prompt": "a cat"}
    rows = "".join(json.dumps(r) + "\n" for r in [*GENEVAL_ROWS, row])
    message = _refusal(_validate(_pipeline(tiny_pipeline, tmp_path, "evaluation_metadata.jsonl", rows, ["saturation"])))
    assert f"{tmp_path / 'evaluation_metadata.jsonl'}:3: " in message
