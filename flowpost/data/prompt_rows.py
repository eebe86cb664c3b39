"""Read one prompt file (``.txt``, ``.jsonl``, ``.csv`` or ``.parquet``) into rows that know their line."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowpost.errors import FlowpostError


@dataclass(frozen=True)
class PromptRow:
    """The fields of one prompt, and ``where`` it is: ``FILE:LINE`` (``FILE:row N`` for parquet)."""

    where: str
    fields: dict[str, Any]


def read_prompt_rows(file: Path) -> list[PromptRow]:
    """The rows of ``file``; unreadable, non-UTF-8 or malformed content is a FlowpostError naming it."""
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        return _parquet_rows(file)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = file.read_bytes()[: exc.start].count(b"\n") + 1
        raise FlowpostError(
            f"not UTF-8 text (byte {exc.start}: {exc.reason}); save the file as UTF-8", where=f"{file}:{line}"
        ) from None
    except OSError as exc:
        raise FlowpostError(f"cannot read this prompt file ({exc.strerror})", where=str(file)) from None
    if suffix == ".txt":
        return [
            PromptRow(f"{file}:{number}", {"prompt": line.strip()})
            for number, line in enumerate(text.splitlines(), start=1)
            if line.strip() and not line.strip().startswith("#")
        ]
    if suffix == ".jsonl":
        return _jsonl_rows(file, text)
    return _csv_rows(file, text)


def _jsonl_rows(file: Path, text: str) -> list[PromptRow]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FlowpostError(f"not JSON ({exc.msg}); write one JSON object per line", where=where) from None
        if not isinstance(row, dict):
            raise FlowpostError("expected an object with a 'prompt'", where=where)
        rows.append(PromptRow(where, row))
    return rows


def _csv_rows(file: Path, text: str) -> list[PromptRow]:
    reader = csv.DictReader(text.splitlines())
    rows = []
    try:
        for row in reader:
            where = f"{file}:{reader.line_num}"
            if None in row:
                raise FlowpostError("more cells than the header has columns; quote cells holding commas", where=where)
            rows.append(PromptRow(where, dict(row)))
    except csv.Error as exc:
        raise FlowpostError(f"not CSV ({exc})", where=f"{file}:{reader.line_num}") from None
    return rows


def _parquet_rows(file: Path) -> list[PromptRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as exc:
        raise FlowpostError(f"not a readable parquet file ({exc}); rewrite or remove it", where=str(file)) from None
    return [PromptRow(f"{file}:row {number}", row) for number, row in enumerate(table.to_pylist(), start=1)]
