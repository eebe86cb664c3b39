"""Source ``preference-pairs``: a caption with a chosen and a rejected image, from a table or two folders.

A table (``.parquet`` / ``.csv`` / ``.jsonl``) holds a caption column and two image columns (``chosen``
and ``rejected`` unless ``chosen_column`` / ``rejected_column`` say otherwise), each holding the encoded
bytes (or a ``{"bytes": ..., "path": ...}`` struct) or a path relative to the table; every other column
becomes the pairs' metadata. A folder holds ``chosen/``, captioned like an image folder (a metadata table
naming ``file_name``, or a sidecar ``.txt``), and ``rejected/`` with an image of the same relative name
for each chosen one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flowpost.core.config.schema.captioned import PreferencePairsDataset
from flowpost.data.sources.base import CaptionedSource
from flowpost.data.sources.contained import contained
from flowpost.data.sources.image_folder import folder_files, folder_fingerprint, folder_items
from flowpost.data.sources.items import PairItem, caption_field, image_cell, json_metadata
from flowpost.data.sources.table import table_fingerprint, table_rows
from flowpost.errors import FlowpostError

CHOSEN, REJECTED = "chosen", "rejected"  # the two subfolders of a pair folder


class PairsSource(CaptionedSource[PreferencePairsDataset]):
    """Reads a ``preference-pairs`` dataset."""

    def items(self, *, where: str) -> Iterator[PairItem]:
        c = self.config
        columns = {"chosen_column": c.chosen_column, "rejected_column": c.rejected_column}
        path, at, outside = Path(c.path), f"{where}.path", c.allow_outside
        return pair_items(path, caption_column=c.caption_column, **columns, where=at, allow_outside=outside)

    def fingerprint(self, *, where: str) -> str:
        c = self.config
        columns = {"chosen_column": c.chosen_column, "rejected_column": c.rejected_column}
        return pairs_fingerprint(Path(c.path), **columns, where=f"{where}.path", allow_outside=c.allow_outside)


def pair_items(
    path: Path, *, caption_column: str | None, chosen_column: str, rejected_column: str, where: str, allow_outside: bool
) -> Iterator[PairItem]:
    """The pairs of a pair folder (``path`` is a directory) or of a table."""
    if path.is_dir():
        return _folder_pairs(path, caption_column=caption_column, where=where, allow_outside=allow_outside)
    columns = {"chosen_column": chosen_column, "rejected_column": rejected_column}
    return _table_pairs(path, caption_column=caption_column, **columns, where=where, allow_outside=allow_outside)


def pairs_fingerprint(path: Path, *, chosen_column: str, rejected_column: str, where: str, allow_outside: bool) -> str:
    """Changes when any file of the pair folder, or the table or an image file it names, does."""
    if path.is_dir():
        return folder_fingerprint(path, where=where, allow_outside=allow_outside)
    _pair_rows(path, chosen_column=chosen_column, rejected_column=rejected_column, where=where)
    columns = (chosen_column, rejected_column)
    return table_fingerprint(path, image_columns=columns, where=where, allow_outside=allow_outside)


def _pair_rows(table: Path, *, chosen_column: str, rejected_column: str, where: str) -> list[Any]:
    rows = table_rows(table, image_column=chosen_column, where=where)
    if rows and rejected_column not in rows[0].fields:
        columns = ", ".join(rows[0].fields)
        raise FlowpostError(
            f"no rejected-image column {rejected_column!r} (columns: {columns}); set rejected_column", where=where
        )
    return rows


def _table_pairs(
    table: Path,
    *,
    caption_column: str | None,
    chosen_column: str,
    rejected_column: str,
    where: str,
    allow_outside: bool,
) -> Iterator[PairItem]:
    """One pair per row, named by its row number."""
    rows = _pair_rows(table, chosen_column=chosen_column, rejected_column=rejected_column, where=where)
    for number, row in enumerate(rows, start=1):
        column, caption = caption_field(row.fields, caption_column)
        extra = {k: v for k, v in row.fields.items() if k not in (chosen_column, rejected_column, column)}
        chosen, rejected = (
            image_cell(table.parent, row.fields[c], allow_outside=allow_outside, where=row.where)
            for c in (chosen_column, rejected_column)
        )
        yield PairItem(f"row-{number}", row.where, chosen, rejected, caption, json_metadata(extra))


def _folder_pairs(root: Path, *, caption_column: str | None, where: str, allow_outside: bool) -> Iterator[PairItem]:
    """The captioned images of ``chosen/``, each with the image of the same name in ``rejected/``."""
    if not (root / REJECTED).is_dir():
        raise FlowpostError(
            f"{root} has no {REJECTED}/ folder; a pair folder holds {CHOSEN}/ (captioned) and {REJECTED}/ images "
            "of the same names",
            where=where,
        )
    folder_files(root, where=where, allow_outside=allow_outside)  # no symlink out of either half
    chosen = folder_items(root / CHOSEN, caption_column=caption_column, where=where, allow_outside=allow_outside)
    for item in chosen:
        rejected = contained(root, root / REJECTED, item.name, allow_outside=allow_outside, where=item.where)
        yield PairItem(item.name, item.where, item.image, rejected, item.caption, item.metadata)
