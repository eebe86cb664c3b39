"""Read one prompt file (``.txt``, ``.jsonl``, ``.csv`` or ``.parquet``) into rows that know their line."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowpost.errors import FlowpostError

BYTE_ORDER_MARK = "\ufeff"
LONE_CARRIAGE_RETURN = re.compile(r"(?<=\r)(?!\n)(?=.)", re.DOTALL)  # split after a \r that ends no \r\n


@dataclass(frozen=True)
class PromptRow:
    """The fields of one prompt, and ``where`` it is: ``FILE:LINE`` (``FILE:row N`` for parquet)."""

    where: str
    fields: dict[str, Any]


def read_prompt_rows(file: Path) -> Iterator[PromptRow]:
    """The rows of ``file``, read line by line; unreadable, non-UTF-8 or malformed content is a FlowpostError
    naming it. A leading UTF-8 byte-order mark is dropped; lines end at ``\\n``, ``\\r\\n`` or ``\\r`` only
    (U+2028 and the other Unicode separators stay inside their line's text)."""
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        yield from _parquet_rows(file)
        return
    lines = _text_lines(file)
    if suffix == ".txt":
        for number, line in lines:
            if line.strip():
                yield PromptRow(f"{file}:{number}", {"prompt": line.strip()})
    elif suffix == ".jsonl":
        yield from _jsonl_rows(file, lines)
    else:
        yield from _csv_rows(file, lines)


def _text_lines(file: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line with its ending)`` of a UTF-8 text file, streamed one line at a time."""
    number, consumed = 0, 0
    try:
        with file.open("rb") as handle:
            for raw in handle:
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise FlowpostError(
                        f"not UTF-8 text (byte {consumed + exc.start}: {exc.reason}); save the file as UTF-8",
                        where=f"{file}:{number + 1}",
                    ) from None
                if consumed == 0:
                    text = text.removeprefix(BYTE_ORDER_MARK)
                consumed += len(raw)
                for line in LONE_CARRIAGE_RETURN.split(text):  # old Mac line ends
                    number += 1
                    yield number, line
    except OSError as exc:
        raise FlowpostError(f"cannot read this prompt file ({exc.strerror})", where=str(file)) from None


def _jsonl_rows(file: Path, lines: Iterator[tuple[int, str]]) -> Iterator[PromptRow]:
    for number, line in lines:
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FlowpostError(f"not JSON ({exc.msg}); write one JSON object per line", where=where) from None
        if not isinstance(row, dict):
            raise FlowpostError("expected an object with a 'prompt'", where=where)
        yield PromptRow(where, row)


def _csv_rows(file: Path, lines: Iterator[tuple[int, str]]) -> Iterator[PromptRow]:
    reader = csv.DictReader(line for _, line in lines)
    try:
        for row in reader:
            where = f"{file}:{reader.line_num}"
            if None in row:
                raise FlowpostError("more cells than the header has columns; quote cells holding commas", where=where)
            yield PromptRow(where, dict(row))
    except csv.Error as exc:
        raise FlowpostError(f"not CSV ({exc})", where=f"{file}:{reader.line_num}") from None


def _parquet_rows(file: Path) -> Iterator[PromptRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(file).iter_batches()
        number = 0
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield PromptRow(f"{file}:row {number}", row)
    except (pa.ArrowException, OSError) as exc:
        raise FlowpostError(f"not a readable parquet file ({exc}); rewrite or remove it", where=str(file)) from None
