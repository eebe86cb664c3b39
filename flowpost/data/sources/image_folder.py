"""Source ``image-folder``: images under a folder, captioned by a metadata table or a sidecar ``.txt``.

The Hugging Face imagefolder layout: a ``metadata.jsonl`` / ``metadata.csv`` / ``metadata.parquet``
in any folder names images by ``file_name`` (relative to that folder) and holds a caption column;
its other columns become the items' metadata. An image no metadata row names is captioned by the
``.txt`` beside it with the same stem. Subfolders are read; hidden files and folders are not. No file
is read from outside the folder (an absolute ``file_name``, ``..`` or a symlink out) unless the dataset
sets ``allow_outside``; every file read is in the fingerprint.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flowpost.core.config.schema.captioned import FileDataset
from flowpost.data.file_hashes import files_fingerprint
from flowpost.data.prompt_rows import read_prompt_rows
from flowpost.data.sources.base import CaptionedSource
from flowpost.data.sources.contained import check_inside, contained
from flowpost.data.sources.items import SourceItem, caption_field, json_metadata
from flowpost.errors import FlowpostError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
METADATA_NAMES = ("metadata.jsonl", "metadata.csv", "metadata.parquet")


class ImageFolderSource(CaptionedSource[FileDataset]):
    """Reads an ``image-folder`` dataset: the files with ``SUFFIXES`` under its folder."""

    SUFFIXES = IMAGE_SUFFIXES

    def items(self, *, where: str) -> Iterator[SourceItem]:
        c, at = self.config, f"{where}.path"
        return folder_items(
            Path(c.path),
            caption_column=c.caption_column,
            where=at,
            suffixes=self.SUFFIXES,
            allow_outside=c.allow_outside,
        )

    def fingerprint(self, *, where: str) -> str:
        return folder_fingerprint(
            Path(self.config.path), where=f"{where}.path", allow_outside=self.config.allow_outside
        )


def folder_files(root: Path, *, where: str, allow_outside: bool = False) -> list[Path]:
    """Every file under ``root`` outside hidden folders, in a stable order, symlinked folders followed (once
    each); a file or folder that leads out of ``root`` is refused unless ``allow_outside``."""
    if not root.is_dir():
        raise FlowpostError(f"folder {str(root)!r} does not exist; create it or fix the path", where=where)
    files = sorted(_visible_files(root))
    if not allow_outside:
        for file in files:
            check_inside(root, file, where=where)
    return files


def _visible_files(root: Path) -> Iterator[Path]:
    seen: set[str] = set()
    for folder, subfolders, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:  # a symlink cycle
            subfolders.clear()
            continue
        seen.add(real)
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        for name in names:
            path = Path(folder) / name
            if not name.startswith(".") and path.is_file():
                yield path


def folder_fingerprint(root: Path, *, where: str, allow_outside: bool = False) -> str:
    """Changes when any file the folder's items read (image, caption or metadata) does, those a metadata
    table names outside the folder included."""
    files = folder_files(root, where=where, allow_outside=allow_outside)
    named = set(_metadata_rows(root, files, allow_outside=allow_outside)) - set(files)
    return files_fingerprint(root, [*files, *sorted(named)])


def folder_items(
    root: Path,
    *,
    caption_column: str | None,
    where: str,
    suffixes: tuple[str, ...] = IMAGE_SUFFIXES,
    allow_outside: bool = False,
) -> Iterator[SourceItem]:
    """The folder's media files (``suffixes``), metadata-named ones included even when their file is
    missing, by path."""
    files = folder_files(root, where=where, allow_outside=allow_outside)
    rows = _metadata_rows(root, files, allow_outside=allow_outside)
    images = {p for p in files if p.suffix.lower() in suffixes} | set(rows)
    if not images:
        raise FlowpostError(f"no {', '.join(suffixes)} files under {root}", where=where)
    for image in sorted(images):
        name = Path(os.path.relpath(image, root)).as_posix()
        if image in rows:
            column, caption = caption_field(rows[image], caption_column)
            extra = {k: v for k, v in rows[image].items() if k not in ("file_name", column)}
        else:
            sidecar = image.with_suffix(".txt")
            caption, extra = (sidecar.read_bytes() if sidecar.is_file() else None), {}
        yield SourceItem(name, str(image), image, caption, json_metadata({"file_name": name, **extra}))


def _metadata_rows(root: Path, files: list[Path], *, allow_outside: bool) -> dict[Path, dict[str, Any]]:
    """Image path -> its metadata row, from every metadata file under ``root``."""
    rows: dict[Path, dict[str, Any]] = {}
    for table in (p for p in files if p.name in METADATA_NAMES):
        for row in read_prompt_rows(table):
            file_name = row.fields.get("file_name")
            if not isinstance(file_name, str) or not file_name:
                raise FlowpostError("this metadata row has no 'file_name'; name the image it captions", where=row.where)
            image = contained(root, table.parent, file_name, allow_outside=allow_outside, where=row.where)
            if image in rows:
                raise FlowpostError(f"{file_name} has a second metadata row; keep one", where=row.where)
            rows[image] = row.fields
    return rows
