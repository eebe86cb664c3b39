"""What a source yields: one captioned image or clip (or preference pair), not yet decoded, and the bad items it
found on the way."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowpost.data.sources.contained import contained

BAD_KINDS = (
    "unreadable_image",  # missing, not an image, or truncated
    "oversized_image",  # more pixels than preprocess.max_megapixels
    "unreadable_video",  # missing, not a video PyAV decodes, or truncated
    "short_video",  # fewer frames than frames.count at frames.fps
    "unconvertible_mode",  # a pixel mode that cannot become grayscale or RGB
    "missing_caption",
    "non_utf8_caption",
    "caption_too_long",
)
DEFAULT_CAPTION_COLUMNS = ("text", "caption")


class BadItem(Exception):
    """An item acquisition skips (and counts): ``kind`` is one of ``BAD_KINDS``."""

    def __init__(self, kind: str, detail: str) -> None:
        assert kind in BAD_KINDS, kind
        super().__init__(detail)
        self.kind = kind


@dataclass(frozen=True)
class SourceItem:
    """One image (or clip) and its caption: ``name`` identifies it within the source (split and crops
    hash it), ``where`` locates it for messages; ``image`` is a file or the encoded bytes (a ``.npy``
    array's included); ``caption`` is raw (text, bytes, or None when absent)."""

    name: str
    where: str
    image: Path | bytes
    caption: Any
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PairItem:
    """One preference pair, not yet decoded: named and located like a ``SourceItem``; each image is a file or the
    encoded bytes; ``caption`` is raw."""

    name: str
    where: str
    chosen: Path | bytes
    rejected: Path | bytes
    caption: Any
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EditItem:
    """One edit, not yet decoded: named and located like a ``SourceItem``; the source and target images are each
    a file or the encoded bytes; ``caption`` is the raw instruction."""

    name: str
    where: str
    source: Path | bytes
    target: Path | bytes
    caption: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    more_sources: tuple[Path | bytes, ...] = ()


def caption_field(fields: dict[str, Any], column: str | None) -> tuple[str | None, Any]:
    """The caption column of a row (``column``, else the first of ``text``, ``caption`` present) and its value."""
    names = (column,) if column is not None else DEFAULT_CAPTION_COLUMNS
    name = next((n for n in names if n in fields), None)
    return name, fields.get(name) if name is not None else None


def caption_text(raw: Any, *, max_chars: int | None) -> str:
    """The stripped caption text, or a BadItem: absent or blank, not UTF-8, or over ``max_chars``."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadItem("non_utf8_caption", f"caption is not UTF-8 (byte {exc.start})") from None
    if not isinstance(raw, str) or not raw.strip():
        raise BadItem("missing_caption", "no caption")
    text = raw.strip()
    if max_chars is not None and len(text) > max_chars:
        raise BadItem(
            "caption_too_long", f"caption has {len(text)} characters, more than max_caption_chars {max_chars}"
        )
    return text


def image_cell(base: Path, value: Any, *, allow_outside: bool, where: str) -> Path | bytes:
    """The image a table cell holds: its bytes (plain or a ``{"bytes", "path"}`` struct, as the ``datasets``
    library writes images), or the file a path names relative to ``base`` (kept inside it unless
    ``allow_outside``); empty bytes (unreadable) otherwise."""
    path = cell_path(value)
    if path is not None:
        return contained(base, base, path, allow_outside=allow_outside, where=where)
    data = value.get("bytes") if isinstance(value, dict) else value
    return data if isinstance(data, bytes) else b""


def cell_path(value: Any) -> str | None:
    """The path an image cell names (a string, or a struct without bytes), else None."""
    if isinstance(value, dict) and not value.get("bytes"):
        value = value.get("path")
    return value if isinstance(value, str) and value else None


def json_metadata(fields: dict[str, Any]) -> dict[str, Any]:
    """The extra columns as JSON values: anything JSON cannot hold becomes its text."""
    return {key: value if _is_json(value) else str(value) for key, value in fields.items()}


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
