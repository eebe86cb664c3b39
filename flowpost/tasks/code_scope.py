"""Which flowpost modules a node's result depends on, found statically from the package's imports.

A module's imports are read with ``ast``: ``import`` and ``from ... import`` anywhere in the file (lazy imports
inside functions included), relative ones resolved. The registries map names to ``"module:attribute"`` strings the
stage process imports when it runs; they are read from their source too, so a scope names the trainer, model family,
rewards, metrics, dataset source and text encoder a node's config uses, not all of them. A plugin the config names
(a ``package.module:Class`` path, or an installed package's entry point, read from its metadata) adds its module,
the modules of its own package it imports and the flowpost modules they import; its package is found with
``importlib.util.find_spec`` and read as files. Nothing here imports the package it reads.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from importlib import metadata, util
from pathlib import Path
from typing import Any

from flowpost.core.plugins import declared, is_path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the flowpost package folder
REQUIREMENT = re.compile(r"\s*[A-Za-z0-9][A-Za-z0-9._-]*")  # the distribution a requirement names
LIBRARIES = ("torch", "diffusers", "transformers", "accelerate", "numpy")  # versions hashed
# registry -> (its module, the name of its ``name -> "module:attribute"`` dict of built-ins)
REGISTRIES = {
    "trainers": ("flowpost.core.trainers.registry", "TRAINERS"),
    "families": ("flowpost.core.models.registry", "FAMILIES"),
    "rewards": ("flowpost.core.rewards.registry", "REWARDS"),
    "metrics": ("flowpost.core.evaluation.registry", "METRICS"),
    "datasets": ("flowpost.core.datasets", "DATASETS"),
    "encoders": ("flowpost.core.models.text_encoders", "ENCODERS"),
}
# config key -> the registry its string value names
NAMED = {"trainer": ("trainers",), "family": ("families",), "source": ("datasets",), "encoder": ("encoders",)}
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


def _registry(path: Path, variable: str) -> tuple[dict[str, str], str]:
    """The literal ``variable = {name: "module:attribute"}`` assigned at the top of ``path``, and the literal
    entry point ``group`` of the ``Registry(..., builtins=variable)`` there."""
    builtins, group = None, None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == variable and value is not None:
            builtins = ast.literal_eval(value)
        elif isinstance(value, ast.Call):
            keywords = {keyword.arg: keyword.value for keyword in value.keywords}
            named = keywords.get("builtins")
            if isinstance(named, ast.Name) and named.id == variable and "group" in keywords:
                group = ast.literal_eval(keywords["group"])
    if builtins is None or group is None:
        raise LookupError(f"{path} assigns no {variable} or no Registry(group=..., builtins={variable})")
    return builtins, group


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


def package_files(top: str) -> dict[str, Path]:
    """Module name -> source file of the top-level module or package ``top`` on ``sys.path``, located without
    importing it; none when it is not installed or has no Python source."""
    try:
        spec = util.find_spec(top)
    except (ImportError, ValueError):
        return {}
    if spec is None:
        return {}
    if spec.submodule_search_locations:  # a package (a namespace package may span several folders)
        return {
            module: path
            for folder in spec.submodule_search_locations
            for module, path in module_paths(Path(folder)).items()
        }
    return {top: Path(spec.origin)} if spec.origin and spec.origin.endswith(".py") else {}


class PackageCode:
    """The sources of a flowpost package folder, and of the plugins configs name: import scopes and their
    fingerprints."""

    def __init__(self, root: Path = PACKAGE_ROOT) -> None:
        self.root = root
        self.paths = module_paths(root)
        self.graph = import_graph(root, runtime_only=True)
        found = {name: _registry(self.paths[module], variable) for name, (module, variable) in REGISTRIES.items()}
        self.registries = {name: builtins for name, (builtins, _) in found.items()}
        self.groups = {name: group for name, (_, group) in found.items()}
        self._packages = {module.partition(".")[0] for module in self.paths}  # top-level names read
        self._digests: dict[str, str] = {}

    def registered(self, config: Any) -> set[str]:
        """The modules the registries resolve for the names ``config`` uses (unknown names resolve to none)."""
        targets = (
            self.registries[registry].get(name)
            for registries, name in _registered_names(config)
            for registry in registries
        )
        return {target.partition(":")[0] for target in targets if target is not None}

    def plugins(self, config: Any) -> dict[str, str]:
        """``registry:name`` -> ``module:attribute`` for each plugin ``config`` names: a class written as a path,
        or an installed package's entry point in the registry's group (unknown names resolve to none)."""
        found = {}
        for registries, name in _registered_names(config):
            for registry in registries:
                if name in self.registries[registry]:
                    continue
                points = declared(self.groups[registry])
                target = name if is_path(name) else next((p.target for p in points if p.name == name), None)
                if target is not None:
                    found[f"{registry}:{name}"] = target
        return dict(sorted(found.items()))

    def plugin_libraries(self, config: Any) -> list[str]:
        """The distributions the extras of the entry points ``config`` names require (``module:Class [extra]``),
        sorted: their versions are hashed with the plugin's code."""
        found: set[str] = set()
        for registries, name in _registered_names(config):
            for registry in registries:
                if name in self.registries[registry] or is_path(name):
                    continue
                for entry in declared(self.groups[registry]):
                    if entry.name == name and entry.plugin and entry.extras:
                        found.update(extra_requirements(entry.plugin, entry.extras))
        return sorted(found)

    def _plugin_module(self, target: str) -> str | None:
        """The module ``target`` imports, its package's sources read; None when it is not installed."""
        module = target.partition(":")[0]
        top = module.partition(".")[0]
        if top not in self._packages:
            self._packages.add(top)
            files = package_files(top)
            self.paths.update(files)
            known = set(self.paths)
            for name, path in files.items():
                self.graph[name] = set(imported_modules(path, name, known, runtime_only=True))
        return module if module in self.graph else None

    def scope(self, entries: Iterable[str], config: Any = None) -> list[str]:
        """The modules ``entries``, the registered names and the plugins of ``config`` run: their imports,
        transitively, and the packages above each (importing a module runs its packages' ``__init__``), sorted."""
        found: set[str] = set()
        plugins = [self._plugin_module(target) for target in self.plugins(config).values()]
        pending = [*entries, *self.registered(config), *(module for module in plugins if module is not None)]
        while pending:
            module = pending.pop()
            if module in found:
                continue
            if module not in self.graph:
                raise LookupError(f"{module} is no module of {self.root}")
            found.add(module)
            pending += self.graph[module]
            parent = module.rpartition(".")[0]
            pending += [parent] if parent in self.graph else []
        return sorted(found)

    def fingerprint(self, modules: Iterable[str], *, plugins: Mapping[str, str], libraries: Iterable[str] = ()) -> str:
        """Hash of ``modules``' names and sources, the ``plugins`` names resolve to (``plugins()``), and the versions
        of the numeric libraries they run on and of the plugins' ``libraries`` (``plugin_libraries()``)."""
        digest = hashlib.sha256()
        for module in sorted(modules):
            digest.update(f"{module}\0{self._digest(module)}\n".encode())
        for name, target in sorted(plugins.items()):
            digest.update(f"{name}={target}\n".encode())
        for dist in (*LIBRARIES, *libraries):
            digest.update(f"{dist}=={library_version(dist)}\n".encode())
        return digest.hexdigest()

    def _digest(self, module: str) -> str:
        if module not in self._digests:
            self._digests[module] = hashlib.sha256(self.paths[module].read_bytes()).hexdigest()
        return self._digests[module]


def extra_requirements(dist: str, extras: Iterable[str]) -> list[str]:
    """The distributions the ``extras`` of the installed distribution ``dist`` require, from its metadata."""
    try:
        requirements = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    markers = {f'extra == "{extra}"' for extra in extras}
    found = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        if any(wanted in marker.replace("'", '"') for wanted in markers) and (name := REQUIREMENT.match(spec)):
            found.append(name.group(0))
    return found


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
