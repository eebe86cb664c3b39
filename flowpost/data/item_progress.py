"""A count of the items a long loop has done, as a tqdm bar on a terminal and silent elsewhere (logs, tests)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def item_progress(items: Iterable[T], *, desc: str, stream: TextIO | None = None) -> Iterator[T]:
    """``items`` unchanged, counted on ``stream`` (default stderr) when it is a terminal."""
    out = sys.stderr if stream is None else stream
    yield from tqdm(items, desc=desc, unit="item", file=out, disable=not out.isatty(), dynamic_ncols=True)
