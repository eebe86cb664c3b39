"""Imports flow downward only: flows -> tasks -> data -> core."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flowpost"
# The stage entry point (core/launch.py) is the composition root that opens the data layer.
COMPOSITION_ROOTS = {"core/launch.py"}
FORBIDDEN = {
    "core": ("prefect", "dvc", "flowpost.data", "flowpost.tasks", "flowpost.flows", "flowpost.cli"),
    "data": ("prefect", "dvc", "flowpost.tasks", "flowpost.flows", "flowpost.cli"),
    "tasks": ("prefect", "flowpost.flows", "flowpost.cli"),
}


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer: str) -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for name in _imports(path)
        if not (str(path.relative_to(PACKAGE)) in COMPOSITION_ROOTS and name.startswith("flowpost.data"))
        and any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN[layer])
    ]
    assert offenders == []


def test_the_cli_answers_help_without_loading_torch() -> None:
    import subprocess
    import sys

    code = "import sys, flowpost.cli; print('torch' in sys.modules, 'prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
