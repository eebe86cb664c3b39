"""Source ``video-folder``: clips under a folder, captioned like an image folder.

A ``metadata.jsonl`` / ``metadata.csv`` / ``metadata.parquet`` names clips by ``file_name``, or a
``.txt`` beside a clip captions it; PyAV decodes them (``flowpost.data.clips``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from flowpost.data.sources.image_folder import folder_items
from flowpost.data.sources.items import SourceItem

VIDEO_SUFFIXES = (".mp4", ".webm", ".mkv", ".mov")


def video_items(root: Path, *, caption_column: str | None, where: str, allow_outside: bool) -> Iterator[SourceItem]:
    """The folder's clips, by path, with their captions and metadata."""
    return folder_items(
        root, caption_column=caption_column, where=where, suffixes=VIDEO_SUFFIXES, allow_outside=allow_outside
    )
