"""Source ``video-folder``: clips under a folder, captioned like an image folder.

A ``metadata.jsonl`` / ``metadata.csv`` / ``metadata.parquet`` names clips by ``file_name``, or a
``.txt`` beside a clip captions it; PyAV decodes them (``flowpost.data.clips``).
"""

from __future__ import annotations

from flowpost.data.sources.image_folder import ImageFolderSource


class VideoFolderSource(ImageFolderSource):
    """Reads a ``video-folder`` dataset: its clips, by path, with their captions and metadata."""

    SUFFIXES = (".mp4", ".webm", ".mkv", ".mov")
