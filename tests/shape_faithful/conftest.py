"""The shape-faithful folders, each built once per session on first use; each test's own outputs removed when it
ends."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shape_faithful.build import CHECKPOINTS, build_folder


@pytest.fixture(scope="session")
def shape_folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``shape_folder(name)``: the pipeline folder of checkpoint ``name`` (a key of ``CHECKPOINTS``), built
    with seed 0 the first time it is asked for (after the folder it shares components with)."""
    built: dict[str, Path] = {}

    def folder(name: str) -> Path:
        if name not in CHECKPOINTS:
            raise KeyError(f"no shape-faithful checkpoint {name!r}; known: {', '.join(CHECKPOINTS)}")
        if name not in built:
            other = CHECKPOINTS[name].shares
            shared = folder(other) if other is not None else None
            built[name] = build_folder(name, tmp_path_factory.mktemp(name) / "pipeline", seed=0, shared=shared)
        return built[name]

    return folder


@pytest.fixture(autouse=True)
def _outputs_removed_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test's ``tmp_path`` (stage outputs: checkpoints and exports of up to 11 GB at these shapes) is deleted when
    the test ends, so the tier's disk stays at the shared folders (about 20 GB) plus one test's outputs."""
    outputs = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if outputs is not None:
        shutil.rmtree(outputs, ignore_errors=True)
