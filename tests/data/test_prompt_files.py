"""Prompt files: formats, metadata, order, errors and the contents fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowpost.data.prompt_files import prompt_files_fingerprint, read_prompt_files
from flowpost.errors import FlowpostError

WHERE = "datasets.prompts.path"


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "prompts"
    (root / "more").mkdir(parents=True)
    (root / "a.txt").write_text("a digit three\n\n  a digit four  \n")
    rows = [{"prompt": "a digit five", "label": 5}, {"prompt": "a digit five", "label": 5}]
    (root / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (root / "c.csv").write_text("prompt,label\na digit six,6\n")
    pq.write_table(pa.table({"prompt": ["a digit seven"], "label": [7]}), root / "more" / "d.parquet")
    return root


def test_every_format_contributes_its_prompts_with_metadata_in_file_order(tmp_path: Path) -> None:
    records = read_prompt_files(_folder(tmp_path), where=WHERE).records
    assert [(r.prompt, r.metadata) for r in records] == [
        ("a digit three", {}),
        ("a digit four", {}),
        ("a digit five", {"label": 5}),  # twice with the same metadata: one record
        ("a digit six", {"label": 6}),  # a csv cell's decimal text is read as the digit
        ("a digit seven", {"label": 7}),
    ]


def test_a_single_file_is_a_prompt_set(tmp_path: Path) -> None:
    file = tmp_path / "one.txt"
    file.write_text("only prompt\n")
    assert [r.prompt for r in read_prompt_files(file, where=WHERE).records] == ["only prompt"]


def test_the_fingerprint_follows_contents_and_names_only(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    before = prompt_files_fingerprint(root, where=WHERE)
    (root / "a.txt").touch()  # a new mtime is not new data
    assert prompt_files_fingerprint(root, where=WHERE) == before
    (root / "e.txt").write_text("a digit eight\n")
    added = prompt_files_fingerprint(root, where=WHERE)
    assert added != before
    (root / "e.txt").write_text("a digit nine\n")
    assert prompt_files_fingerprint(root, where=WHERE) not in (before, added)


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("bad.jsonl", '{"prompt": "ok"}\nnot json\n', r"bad\.jsonl:2: not JSON"),
        ("bad.jsonl", '["a list"]\n', r"bad\.jsonl:1: expected an object"),
        ("bad.csv", "text,label\nhello,1\n", r"bad\.csv:2: this row has no 'prompt' field \(its fields: text, label\)"),
        ("bad.jsonl", '{"prompt": 42}\n', r"bad\.jsonl:1: 'prompt' is 42 \(int\), not text"),
        ("bad.jsonl", '{"prompt": " \\u0000 "}\n', r"bad\.jsonl:1: 'prompt' is blank"),
        ("bad.csv", "prompt,label\na one,1,extra\n", r"bad\.csv:2: more cells than the header has columns"),
        ("bad.jsonl", '{"prompt": "a one", "label": 1.9}\n', r"bad\.jsonl:1: label 1\.9 is not an integer"),
        ("bad.jsonl", '{"prompt": "a one", "label": true}\n', r"bad\.jsonl:1: label True is a boolean"),
        ("bad.csv", "prompt,label\na one,1\na minus one,-1\n", r"bad\.csv:3: label '-1' is not an integer"),
        ("bad.parquet", "PAR1 truncated", r"bad\.parquet: not a readable parquet file"),
        ("notes.md", "hello\n", r"notes\.md: not a prompt file"),
    ],
)
def test_bad_files_are_named(tmp_path: Path, name: str, text: str, match: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(FlowpostError, match=match):
        read_prompt_files(tmp_path, where=WHERE)


def test_a_missing_path_or_an_empty_folder_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FlowpostError, match="does not exist; create it or fix the path") as info:
        read_prompt_files(tmp_path / "nowhere", where=WHERE)
    assert info.value.where == WHERE
    (tmp_path / "empty").mkdir()
    with pytest.raises(FlowpostError, match="no prompt files"):
        prompt_files_fingerprint(tmp_path / "empty", where=WHERE)


def test_a_prompt_with_two_different_labels_names_both_places(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"prompt": "a digit", "label": 1}\n')
    (tmp_path / "b.csv").write_text("prompt,label\nother,2\na digit,7\n")
    with pytest.raises(FlowpostError) as info:
        read_prompt_files(tmp_path, where=WHERE)
    assert str(info.value) == (
        f"{tmp_path / 'b.csv'}:3: prompt 'a digit' has metadata {{'label': 7}} here and {{'label': 1}} at "
        f"{tmp_path / 'a.jsonl'}:1; keep one of them"
    )


def test_a_file_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "latin.txt").write_bytes("a digit one\nun chiffre \u00e9\n".encode("latin-1"))
    with pytest.raises(FlowpostError) as info:
        read_prompt_files(tmp_path, where=WHERE)
    assert str(info.value).startswith(f"{tmp_path / 'latin.txt'}:2: not UTF-8 text (byte 23: invalid")
    assert str(info.value).endswith("save the file as UTF-8")


def _prompts(tmp_path: Path, name: str, data: bytes) -> tuple[list[str], int]:
    (tmp_path / name).write_bytes(data)
    read = read_prompt_files(tmp_path / name, where=WHERE)
    return [r.prompt for r in read.records], read.control_characters_removed


@pytest.mark.parametrize(
    ("name", "data", "prompts", "removed"),
    [
        ("bom.txt", "\ufeffa red cat\na dog\n".encode(), ["a red cat", "a dog"], 0),
        ("bom.csv", "\ufeffprompt\na red cat\n".encode(), ["a red cat"], 0),
        ("bom.jsonl", '\ufeff{"prompt": "a red cat"}\n'.encode(), ["a red cat"], 0),
        ("nul.txt", b"a red\x00 cat\x07\na dog\n", ["a red cat", "a dog"], 2),
        ("nul.jsonl", b'{"prompt": "a red\\u0000 cat\\u009b"}\n', ["a red cat"], 2),
        ("separator.txt", "a red cat\u2028on a mat\na dog\n".encode(), ["a red cat\u2028on a mat", "a dog"], 0),
        ("endings.txt", b"a red cat\r\na dog\ra fox\n", ["a red cat", "a dog", "a fox"], 0),
        ("hash.txt", b"# a hashtag is a prompt too\n", ["# a hashtag is a prompt too"], 0),
    ],
)
def test_prompt_text_is_read_as_written(tmp_path: Path, name: str, data: bytes, prompts: list, removed: int) -> None:
    assert _prompts(tmp_path, name, data) == (prompts, removed)


def test_rows_stream_one_line_at_a_time(tmp_path: Path) -> None:
    from flowpost.data.prompt_rows import read_prompt_rows

    (tmp_path / "big.txt").write_bytes(b"first prompt\n" + b"\xff never decoded before the first row\n")
    rows = read_prompt_rows(tmp_path / "big.txt")
    assert next(rows).fields == {"prompt": "first prompt"}  # yielded before the bad second line is read
    with pytest.raises(FlowpostError, match=r"big\.txt:2: not UTF-8 text \(byte 13"):
        next(rows)
