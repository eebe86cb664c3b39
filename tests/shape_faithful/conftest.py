"""The shape-faithful folders, each built once per session on first use."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shape_faithful.build import CHECKPOINTS, build_folder


@pytest.fixture(scope="session")
def shape_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``shape_folder(name)``: the pipeline folder of checkpoint ``name`` (a key of ``CHECKPOINTS``), built
    with seed 0 the first time it is asked for."""
    built: dict[str, Path] = {}

    def folder(name: str) -> Path:
        if name not in CHECKPOINTS:
            raise KeyError(f"no shape-faithful checkpoint {name!r}; known: {', '.join(CHECKPOINTS)}")
        if name not in built:
            built[name] = build_folder(name, tmp_path_factory.mktemp(name) / "pipeline", seed=0)
        return built[name]

    return folder
