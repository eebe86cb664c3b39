"""Source ``edit-pairs``: a ``.parquet`` / ``.csv`` / ``.jsonl`` of edits, each an instruction, a source image and
a target image.

Each image column holds the encoded bytes (or a ``{"bytes": ..., "path": ...}`` struct) or a path relative to the
table's folder (which it may not leave unless the dataset sets ``allow_outside``); every other column becomes the
items' metadata.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from flowpost.core.config.schema.captioned import EditPairsDataset
from flowpost.data.prompt_rows import PromptRow
from flowpost.data.sources.base import CaptionedSource
from flowpost.data.sources.items import EditItem, caption_field, image_cell, json_metadata
from flowpost.data.sources.table import table_fingerprint, table_rows
from flowpost.errors import FlowpostError


class EditPairsSource(CaptionedSource[EditPairsDataset]):
    """Reads an ``edit-pairs`` dataset."""

    def items(self, *, where: str) -> Iterator[EditItem]:
        c = self.config
        table, at = Path(c.path), f"{where}.path"
        columns = (c.source_column, c.target_column, *c.more_source_columns)
        for number, row in enumerate(_edit_rows(table, columns, where=at), start=1):
            column, caption = caption_field(row.fields, c.caption_column)
            extra = {k: v for k, v in row.fields.items() if k not in (*columns, column)}
            source, target, *more = (
                image_cell(table.parent, row.fields[name], allow_outside=c.allow_outside, where=row.where)
                for name in columns
            )
            yield EditItem(f"row-{number}", row.where, source, target, caption, json_metadata(extra), tuple(more))

    def fingerprint(self, *, where: str) -> str:
        c = self.config
        columns = (c.source_column, c.target_column, *c.more_source_columns)
        _edit_rows(Path(c.path), columns, where=f"{where}.path")
        return table_fingerprint(
            Path(c.path), image_columns=columns, where=f"{where}.path", allow_outside=c.allow_outside
        )


def _edit_rows(table: Path, columns: tuple[str, ...], *, where: str) -> list[PromptRow]:
    """The table's rows, refused when it lacks the target column or a further source column (``table_rows``
    checks the source column)."""
    rows = table_rows(table, image_column=columns[0], where=where)
    if rows and columns[1] not in rows[0].fields:
        names = ", ".join(rows[0].fields)
        raise FlowpostError(f"no target-image column {columns[1]!r} (columns: {names}); set target_column", where=where)
    missing = [column for column in columns[2:] if rows and column not in rows[0].fields]
    if missing:
        names = ", ".join(rows[0].fields)
        raise FlowpostError(
            f"no source-image column {missing[0]!r} (columns: {names}); fix more_source_columns", where=where
        )
    return rows
