"""Which flowpost modules a node's result depends on, found statically from the package's imports.

A module's imports are read with ``ast``: ``import`` and ``from ... import`` anywhere in the file (lazy
imports inside functions included), relative ones resolved. The registries map names to
``"module:attribute"`` strings the stage process imports when it runs; they are read from their source
too, so a scope names the trainer, model family, rewards and metrics a node's config uses, not all of
them. Nothing here imports the package it reads.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable, Iterator
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the flowpost package folder
LIBRARIES = ("torch", "diffusers", "transformers", "accelerate", "numpy", "scikit-learn")  # versions hashed
# registry -> (its module, the name of its ``name -> "module:attribute"`` dict)
REGISTRIES = {
    "trainers": ("flowpost.core.trainers.registry", "TRAINERS"),
    "families": ("flowpost.core.models.registry", "FAMILIES"),
    "rewards": ("flowpost.core.rewards.registry", "REWARDS"),
    "metrics": ("flowpost.core.evaluation.registry", "METRICS"),
}
NAMED = {"trainer": ("trainers",), "family": ("families",)}  # config key -> the registry its string value names
# config key -> the registries the ``name`` of its entry (or of each entry of its list) names
ENTRIES = {"rewards": ("rewards",), "metrics": ("metrics", "rewards"), "metric": ("metrics", "rewards")}
KEYED = {"bounds": ("metrics", "rewards")}  # config key -> the registries the keys of its mapping name


def module_name(path: Path, root: Path) -> str:
    """The dotted module name of ``path`` inside the package at ``root``."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` names (relative ones resolved against ``package``)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*parts, node.module] if node.module else parts)


def _type_checking(node: ast.AST) -> bool:
    """``node`` is ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): its body never runs."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(tree: ast.AST, *, runtime_only: bool) -> Iterator[ast.AST]:
    """Every node of ``tree``; with ``runtime_only``, not the bodies of ``if TYPE_CHECKING:``."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if runtime_only and _type_checking(node):
            assert isinstance(node, ast.If)
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))


def imported_modules(path: Path, module: str, modules: set[str], *, runtime_only: bool = False) -> Iterator[str]:
    """The ``modules`` that ``path`` (module ``module``) imports anywhere in it, lazy imports included;
    ``TYPE_CHECKING`` imports too unless ``runtime_only``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _walk(ast.parse(path.read_text()), runtime_only=runtime_only):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, package)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    yield f"{base}.{alias.name}"
                elif base in modules:
                    yield base


def module_paths(root: Path) -> dict[str, Path]:
    """Module name -> source file of every module of the package at ``root``."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def import_graph(root: Path, *, runtime_only: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of the package at ``root`` it imports (see ``imported_modules``)."""
    paths = module_paths(root)
    modules = set(paths)
    return {
        module: set(imported_modules(path, module, modules, runtime_only=runtime_only))
        for module, path in paths.items()
    }


def _registry(path: Path, variable: str) -> dict[str, str]:
    """The literal ``variable = {name: "module:attribute"}`` assigned at the top of ``path``."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == variable and value is not None:
            return ast.literal_eval(value)
    raise LookupError(f"{path} assigns no {variable}")


def _registered_names(value: Any, key: str | None = None) -> Iterator[tuple[tuple[str, ...], str]]:
    """(registries, name) for each registered name a node's config uses (see ``NAMED``, ``ENTRIES``, ``KEYED``)."""
    if isinstance(value, str) and key in NAMED:
        yield NAMED[key], value
    elif isinstance(value, list):
        for item in value:
            yield from _registered_names(item, key)
    elif isinstance(value, dict):
        if key in ENTRIES and isinstance(value.get("name"), str):
            yield ENTRIES[key], value["name"]
        if key in KEYED:
            yield from ((KEYED[key], name) for name in value)
        for sub, item in value.items():
            yield from _registered_names(item, sub)


class PackageCode:
    """The sources of a flowpost package folder: import scopes and their fingerprints."""

    def __init__(self, root: Path = PACKAGE_ROOT) -> None:
        self.root = root
        self.paths = module_paths(root)
        self.graph = import_graph(root, runtime_only=True)
        self.registries = {
            name: _registry(self.paths[module], variable) for name, (module, variable) in REGISTRIES.items()
        }
        self._digests: dict[str, str] = {}

    def registered(self, config: Any) -> set[str]:
        """The modules the registries resolve for the names ``config`` uses (unknown names resolve to none)."""
        targets = (
            self.registries[registry].get(name)
            for registries, name in _registered_names(config)
            for registry in registries
        )
        return {target.partition(":")[0] for target in targets if target is not None}

    def scope(self, entries: Iterable[str], config: Any = None) -> list[str]:
        """The modules ``entries`` and the registered names of ``config`` run: their imports, transitively, and
        the packages above each (importing a module runs its packages' ``__init__``), sorted."""
        found: set[str] = set()
        pending = [*entries, *self.registered(config)]
        while pending:
            module = pending.pop()
            if module in found:
                continue
            if module not in self.graph:
                raise LookupError(f"{module} is no module of {self.root}")
            found.add(module)
            pending += self.graph[module]
            parent = module.rpartition(".")[0]
            pending += [parent] if parent else []
        return sorted(found)

    def fingerprint(self, modules: Iterable[str]) -> str:
        """Hash of ``modules``' names and sources plus the versions of the numeric libraries they run on."""
        digest = hashlib.sha256()
        for module in sorted(modules):
            digest.update(f"{module}\0{self._digest(module)}\n".encode())
        for dist in LIBRARIES:
            digest.update(f"{dist}=={library_version(dist)}\n".encode())
        return digest.hexdigest()

    def _digest(self, module: str) -> str:
        if module not in self._digests:
            self._digests[module] = hashlib.sha256(self.paths[module].read_bytes()).hexdigest()
        return self._digests[module]


def library_version(dist: str) -> str:
    """The installed version of ``dist``, or ``absent``."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


@cache
def installed_code() -> PackageCode:
    """The running flowpost's sources (read once per process)."""
    return PackageCode(PACKAGE_ROOT)
