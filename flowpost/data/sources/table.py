"""Source ``table``: a ``.parquet`` / ``.csv`` / ``.jsonl`` of captions and images.

The image column holds the encoded bytes (or a ``{"bytes": ..., "path": ...}`` struct, as the
``datasets`` library writes images), or a path relative to the table's folder (which it may not leave
unless the dataset sets ``allow_outside``). Every other column becomes the items' metadata.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from flowpost.core.config.schema.captioned import TableDataset
from flowpost.data.file_hashes import files_fingerprint
from flowpost.data.prompt_rows import PromptRow, read_prompt_rows
from flowpost.data.sources.base import CaptionedSource
from flowpost.data.sources.items import SourceItem, caption_field, image_cell, json_metadata
from flowpost.errors import FlowpostError

SUFFIXES = (".parquet", ".csv", ".jsonl")


class TableSource(CaptionedSource[TableDataset]):
    """Reads a ``table`` dataset."""

    def items(self, *, where: str) -> Iterator[SourceItem]:
        c = self.config
        columns = {"caption_column": c.caption_column, "image_column": c.image_column}
        return table_items(Path(c.path), **columns, where=f"{where}.path", allow_outside=c.allow_outside)

    def fingerprint(self, *, where: str) -> str:
        c = self.config
        at = f"{where}.path"
        return table_fingerprint(Path(c.path), image_columns=(c.image_column,), where=at, allow_outside=c.allow_outside)


def table_rows(table: Path, *, image_column: str, where: str) -> list[PromptRow]:
    """The table's rows; a missing file, another format or a missing image column is a FlowpostError."""
    if not table.is_file() or table.suffix.lower() not in SUFFIXES:
        raise FlowpostError(f"{table} is not a {'/'.join(SUFFIXES)} file; fix the path", where=where)
    rows = list(read_prompt_rows(table))
    if rows and image_column not in rows[0].fields:
        columns = ", ".join(rows[0].fields)
        raise FlowpostError(f"no image column {image_column!r} (columns: {columns}); set image_column", where=where)
    return rows


def table_fingerprint(table: Path, *, image_columns: tuple[str, ...], where: str, allow_outside: bool) -> str:
    """Changes when the table or an image file its ``image_columns`` name does."""
    files = set()
    for row in table_rows(table, image_column=image_columns[0], where=where):
        for column in image_columns:
            image = image_cell(table.parent, row.fields.get(column), allow_outside=allow_outside, where=row.where)
            if isinstance(image, Path):
                files.add(image)
    return files_fingerprint(table.parent, [table, *sorted(files)])


def table_items(
    table: Path, *, caption_column: str | None, image_column: str, where: str, allow_outside: bool
) -> Iterator[SourceItem]:
    """One item per row, named by its row number."""
    for number, row in enumerate(table_rows(table, image_column=image_column, where=where), start=1):
        column, caption = caption_field(row.fields, caption_column)
        extra = {k: v for k, v in row.fields.items() if k not in (image_column, column)}
        image = image_cell(table.parent, row.fields[image_column], allow_outside=allow_outside, where=row.where)
        yield SourceItem(f"row-{number}", row.where, image, caption, json_metadata(extra))
