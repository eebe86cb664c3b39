"""Small images and captioned-image folders made in the tests."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from PIL import Image


def png_bytes(value: int = 128, size: tuple[int, int] = (12, 10), mode: str = "RGB") -> bytes:
    """An encoded PNG of one colour."""
    buffer = io.BytesIO()
    Image.new(mode, size, (value, 255 - value, 7) if mode == "RGB" else value).save(buffer, format="PNG")
    return buffer.getvalue()


def make_image_folder(root: Path, count: int = 8, *, extra: dict[str, Any] | None = None) -> Path:
    """``count`` PNGs under ``root`` with a metadata.jsonl captioning each (``extra`` columns on every row)."""
    root.mkdir(parents=True)
    lines = []
    for i in range(count):
        (root / f"{i:02d}.png").write_bytes(png_bytes(10 * i))
        lines.append(json.dumps({"file_name": f"{i:02d}.png", "text": f"a square of shade {i}", **(extra or {})}))
    (root / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return root
