"""Plugin packages installed into a folder the way ``pip install --target`` lays them out: the package and a
``.dist-info`` folder whose ``entry_points.txt`` importlib.metadata reads."""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flowpost-example-plugin"
PACKAGE = "flowpost_example_plugin"
DISTRIBUTION = "flowpost-example-plugin"


def write_distribution(site: Path, name: str, entry_points: dict[str, dict[str, str]]) -> Path:
    """The ``.dist-info`` of distribution ``name`` (version 0.1.0) in ``site``, declaring ``entry_points``
    (group -> entry point name -> ``module:attribute``)."""
    info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    sections = (
        f"[{group}]\n" + "".join(f"{point} = {target}\n" for point, target in points.items())
        for group, points in entry_points.items()
    )
    (info / "entry_points.txt").write_text("\n".join(sections))
    return info


def example_entry_points() -> dict[str, dict[str, str]]:
    """The entry points the example plugin's ``pyproject.toml`` declares: group -> name -> ``module:attribute``."""
    return tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]


def install_example_plugin(site: Path, points: dict[str, dict[str, str]] | None = None) -> Path:
    """The example plugin in ``site``: its package, and its entry points (by default those it declares)."""
    shutil.copytree(EXAMPLE / PACKAGE, site / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    write_distribution(site, DISTRIBUTION, example_entry_points() if points is None else points)
    return site


@contextmanager
def on_path(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``site`` on this process's path and on the ``PYTHONPATH`` of the processes it starts; the modules of its
    packages are forgotten afterwards, so a later test imports them from its own site."""
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site), prepend=os.pathsep)
    try:
        yield site
    finally:
        packages = {path.name.removesuffix(".py") for path in site.iterdir() if not path.name.endswith(".dist-info")}
        for module in [name for name in sys.modules if name.partition(".")[0] in packages]:
            del sys.modules[module]
