"""Fixtures: a captioned-image folder under the test's tmp_path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from image_samples import make_image_folder


@pytest.fixture
def image_folder(tmp_path: Path) -> Callable[..., Path]:
    """``image_folder(n, extra=...)``: ``n`` PNGs with a metadata.jsonl captioning each."""
    return lambda count=8, **kwargs: make_image_folder(tmp_path / "folder", count, **kwargs)
