"""Hostile prompt files: every broken file stops its acquisition with one line naming the file (and line)
and what to do, no traceback, and no output written."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hostile_cli import nothing_written, pipeline_with, refused


def _jsonl(*rows: object) -> bytes:
    return ("\n".join(json.dumps(row) for row in rows) + "\n").encode()


def _parquet(table: dict) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(table), sink)
    return sink.getvalue().to_pybytes()


# name -> (file name, bytes, what the error names after the file)
FILES: dict[str, tuple[str, bytes, str]] = {
    "txt-latin1-line-1": ("p.txt", "caf\xe9\n".encode("latin-1"), ":1: not UTF-8 text"),
    "txt-latin1-line-3": ("p.txt", b"a\nb\n\xe9t\xe9\n", ":3: not UTF-8 text"),
    "txt-utf16": ("p.txt", "a red cat\n".encode("utf-16"), ":1: not UTF-8 text"),
    "txt-lone-continuation-byte": ("p.txt", b"a \x80 cat\n", ":1: not UTF-8 text"),
    "txt-truncated-sequence": ("p.txt", b"a cat \xe2\x82\n", ":1: not UTF-8 text"),
    "txt-empty": ("p.txt", b"", "no prompts found"),
    "txt-blank-lines": ("p.txt", b"\n  \n\t\n", "no prompts found"),
    "txt-bom-only": ("p.txt", b"\xef\xbb\xbf", "no prompts found"),
    "jsonl-trailing-comma": ("p.jsonl", b'{"prompt": "a",}\n', ":1: not JSON"),
    "jsonl-single-quotes": ("p.jsonl", b"{'prompt': 'a'}\n", ":1: not JSON"),
    "jsonl-bare-word": ("p.jsonl", b'{"prompt": "a"}\ncat\n', ":2: not JSON"),
    "jsonl-truncated": ("p.jsonl", b'{"prompt": "a', ":1: not JSON"),
    "jsonl-nan": ("p.jsonl", b'{"prompt": "a", "label": NaN}\n', ":1: label nan"),
    "jsonl-list": ("p.jsonl", _jsonl(["a"]), ":1: expected an object"),
    "jsonl-string": ("p.jsonl", _jsonl("a red cat"), ":1: expected an object"),
    "jsonl-number": ("p.jsonl", _jsonl(3), ":1: expected an object"),
    "jsonl-null": ("p.jsonl", _jsonl(None), ":1: expected an object"),
    "jsonl-true": ("p.jsonl", _jsonl(True), ":1: expected an object"),
    "jsonl-no-prompt": ("p.jsonl", _jsonl({"text": "a"}), ":1: this row has no 'prompt' field (its fields: text)"),
    "jsonl-empty-object": ("p.jsonl", _jsonl({}), ":1: this row has no 'prompt' field (its fields: none)"),
    "jsonl-prompt-int": ("p.jsonl", _jsonl({"prompt": 42}), ":1: 'prompt' is 42 (int), not text"),
    "jsonl-prompt-float": ("p.jsonl", _jsonl({"prompt": 4.2}), ":1: 'prompt' is 4.2 (float), not text"),
    "jsonl-prompt-list": ("p.jsonl", _jsonl({"prompt": ["a"]}), ":1: 'prompt' is ['a'] (list), not text"),
    "jsonl-prompt-dict": ("p.jsonl", _jsonl({"prompt": {"en": "a"}}), "(dict), not text"),
    "jsonl-prompt-null": ("p.jsonl", _jsonl({"prompt": None}), ":1: 'prompt' is None (NoneType), not text"),
    "jsonl-prompt-bool": ("p.jsonl", _jsonl({"prompt": True}), ":1: 'prompt' is True (bool), not text"),
    "jsonl-prompt-blank": ("p.jsonl", _jsonl({"prompt": "   "}), ":1: 'prompt' is blank"),
    "jsonl-prompt-controls-only": ("p.jsonl", _jsonl({"prompt": "\u0000\u0007"}), ":1: 'prompt' is blank"),
    "jsonl-label-fraction": ("p.jsonl", _jsonl({"prompt": "a", "label": 1.9}), ":1: label 1.9 is not an integer"),
    "jsonl-label-bool": ("p.jsonl", _jsonl({"prompt": "a", "label": True}), ":1: label True is a boolean"),
    "jsonl-label-negative": ("p.jsonl", _jsonl({"prompt": "a", "label": -1}), ":1: label -1 is negative"),
    "jsonl-label-word": ("p.jsonl", _jsonl({"prompt": "a", "label": "seven"}), ":1: label 'seven'"),
    "jsonl-label-list": ("p.jsonl", _jsonl({"prompt": "a", "label": [1]}), ":1: label [1]"),
    "jsonl-conflicting-labels": (
        "p.jsonl",
        _jsonl({"prompt": "a", "label": 1}, {"prompt": "a", "label": 2}),
        ":2: prompt 'a' has metadata",
    ),
    "jsonl-latin1": ("p.jsonl", '{"prompt": "caf\xe9"}\n'.encode("latin-1"), ":1: not UTF-8 text"),
    "csv-extra-cells": ("p.csv", b"prompt,label\na,1,2\n", ":2: more cells than the header has columns"),
    "csv-no-prompt-column": ("p.csv", b"text\na\n", ":2: this row has no 'prompt' field (its fields: text)"),
    "csv-label-word": ("p.csv", b"prompt,label\na,three\n", ":2: label 'three'"),
    "csv-blank-prompt": ("p.csv", b"prompt,label\n ,1\n", ":2: 'prompt' is blank"),
    "csv-latin1": ("p.csv", "prompt\ncaf\xe9\n".encode("latin-1"), ":2: not UTF-8 text"),
    "csv-header-only": ("p.csv", b"prompt,label\n", "no prompts found"),
    "parquet-corrupt": ("p.parquet", b"PAR1 not really", "not a readable parquet file"),
    "parquet-empty-bytes": ("p.parquet", b"", "not a readable parquet file"),
    "parquet-no-prompt": ("p.parquet", _parquet({"text": ["a"]}), ":row 1: this row has no 'prompt' field"),
    "parquet-prompt-int": ("p.parquet", _parquet({"prompt": [3]}), ":row 1: 'prompt' is 3 (int), not text"),
    "parquet-prompt-null": ("p.parquet", _parquet({"prompt": [None]}), ":row 1: 'prompt' is None"),
    "md-suffix": ("notes.md", b"a cat\n", "not a prompt file (expected one of .txt, .jsonl, .csv, .parquet)"),
    "json-suffix": ("p.json", b'[{"prompt": "a"}]', "not a prompt file"),
    "yaml-suffix": ("p.yaml", b"- a cat\n", "not a prompt file"),
    "tsv-suffix": ("p.tsv", b"prompt\ta\n", "not a prompt file"),
}


def _acquire(tmp_path: Path, path: str) -> tuple[Path, Path]:
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump(pipeline_with({"prompts": {"source": "prompt-files", "path": path}})))
    return pipeline, tmp_path / "ws"


@pytest.mark.parametrize("case", sorted(FILES))
def test_a_broken_prompt_file_is_named_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    name, data, says = FILES[case]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / name).write_bytes(data)
    pipeline, workspace = _acquire(tmp_path, "prompts")
    where = "datasets.prompts.path" if "no prompts found" in says or "suffix" in case else f"prompts/{name}"
    outcome = refused(
        "run-node", "acquire.prompts", "--pipeline", str(pipeline), "--workspace", str(workspace), naming=says
    )
    assert where in outcome.stderr, outcome.stderr
    nothing_written(workspace)


@pytest.mark.parametrize("layout", ["missing", "empty-folder", "hidden-only"])
def test_a_prompt_path_with_no_files_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    monkeypatch.chdir(tmp_path)
    if layout != "missing":
        (tmp_path / "prompts").mkdir()
    if layout == "hidden-only":
        (tmp_path / "prompts" / ".draft.txt").write_text("a cat\n")
    pipeline, workspace = _acquire(tmp_path, "prompts")
    says = "does not exist; create it or fix the path" if layout == "missing" else "no prompt files in prompts"
    refused("plan", str(pipeline), "--workspace", str(workspace), naming=says)
    nothing_written(workspace)
