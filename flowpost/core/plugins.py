"""One registry per kind of pluggable class: trainers, model families, rewards, evaluation metrics, dataset sources and
text encoders.

A name in a pipeline file is a built-in (the registry's static ``name -> "module:attribute"`` dict), an entry point
an installed package declares in the registry's group (``flowpost.rewards``, ...), or a class written as
``package.module:Class``. An entry point may name the extras it needs (``module:Class [extra]``): when its import
fails, the error says which extra to install. A class is imported only when used, and checked against the registry's
base (a class it must subclass, or a protocol whose methods it must implement) when it is.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import Any

from flowpost.core.lazy import construct, import_object, unknown_name
from flowpost.errors import FlowpostError


def is_path(name: str) -> bool:
    """``name`` is written as ``package.module:Class`` (a registered name has no colon)."""
    return ":" in name


@dataclass(frozen=True)
class Entry:
    """A registered name: the ``module:attribute`` it imports and, for a plugin, the distribution declaring it and
    the extras of that distribution it needs."""

    name: str
    target: str
    plugin: str | None = None
    extras: tuple[str, ...] = ()


@cache
def _declared(group: str, search_path: tuple[str, ...]) -> tuple[Entry, ...]:
    return tuple(
        Entry(
            point.name,
            f"{point.module}:{point.attr}",
            point.dist.name if point.dist is not None else "an unnamed distribution",
            tuple(point.extras),
        )
        for point in metadata.entry_points(group=group)
    )


def declared(group: str) -> tuple[Entry, ...]:
    """The entry points installed packages declare in ``group``, read from their metadata (nothing is imported;
    read again when ``sys.path`` changes)."""
    return _declared(group, tuple(sys.path))


@dataclass(frozen=True)
class Registry:
    """The ``kind`` things (``plural``) flowpost can load by name: ``builtins`` and the entry points of ``group``;
    each is a ``base`` (``"module:Class"``, imported when a class is checked)."""

    kind: str
    plural: str
    group: str
    builtins: Mapping[str, str]
    base: str

    def entries(self, *, where: str) -> dict[str, Entry]:
        """Every registered name, sorted. An entry point reusing a built-in's or another package's name is an
        error naming ``where``: which class the name means would depend on what is installed."""
        found = {name: Entry(name, target) for name, target in self.builtins.items()}
        for entry in declared(self.group):
            taken = found.setdefault(entry.name, entry)
            if taken != entry:
                owner = f"package {taken.plugin!r}" if taken.plugin else "flowpost's built-in"
                raise FlowpostError(
                    f"package {entry.plugin!r} declares {self.kind} {entry.name!r} ({entry.target}) in entry point "
                    f"group {self.group}, and {owner} {self.kind} {entry.name!r} ({taken.target}) has that name; "
                    "rename the entry point, or uninstall one of the packages",
                    where=where,
                )
        return dict(sorted(found.items()))

    def unknown(self, name: str, known: Iterable[str]) -> str:
        """The error for ``name`` not among ``known``: the close names, and how to name a plugin's class."""
        return (
            unknown_name(self.kind, name, known, plural=self.plural)
            + "; a plugin's class is named by its entry point or as package.module:Class"
        )

    def target(self, name: str, *, where: str) -> str:
        """The ``module:attribute`` that ``name`` imports; an unknown name is an error naming ``where``."""
        if is_path(name):
            return name
        entries = self.entries(where=where)
        if name not in entries:
            raise FlowpostError(self.unknown(name, entries), where=where)
        return entries[name].target

    def load(self, name: str, *, where: str) -> Any:
        """The class ``name`` stands for, imported and checked against ``base``; errors name ``where``."""
        target = self.target(name, where=where)
        try:
            cls = import_object(target, what=f"{self.kind} {name!r}", where=where)
        except FlowpostError as exc:
            missing = self._missing_extra(name, exc, where=where)
            if missing is None:
                raise
            raise missing from exc.__cause__
        if problem := self.mismatch(cls):
            named = f"{name!r}" if target == name else f"{name!r} ({target})"
            raise FlowpostError(f"{self.kind} {named} {problem}", where=where)
        return cls

    def _missing_extra(self, name: str, exc: FlowpostError, *, where: str) -> FlowpostError | None:
        """The error for a plugin whose entry point names extras and whose import found a module missing."""
        entry = None if is_path(name) else self.entries(where=where).get(name)
        if entry is None or not entry.extras or not isinstance(exc.__cause__, ModuleNotFoundError):
            return None
        extras = ",".join(entry.extras)
        return FlowpostError(
            f"{self.kind} {name!r} comes with the {extras} extra of {entry.plugin}, which is not installed "
            f"({exc.__cause__}); pip install '{entry.plugin}[{extras}]'",
            where=where,
        )

    def problem(self, name: str, *, where: str) -> str | None:
        """Why ``name`` cannot be used (``where: message``), or None. A plugin is imported and checked; a
        built-in is not (the test suite checks those)."""
        try:
            if self.target(name, where=where) != self.builtins.get(name):
                self.load(name, where=where)
        except FlowpostError as exc:
            return str(exc)
        return None

    def build(self, name: str, *, options: dict[str, Any], where: str) -> Any:
        """The class ``name`` stands for, constructed with ``options`` (``construct``); an instance lacking an
        attribute the protocol ``base`` declares is an error naming ``where``."""
        instance = construct(self.load(name, where=where), kind=self.kind, name=name, options=options, where=where)
        base = import_object(self.base, what=f"the {self.kind} base", where=where)
        if missing := [attribute for attribute in _protocol_attributes(base) if not hasattr(instance, attribute)]:
            raise FlowpostError(
                f"{self.kind} {name!r} has no {', '.join(missing)}, which every {self.kind} has; set it on the class "
                "or in its __init__",
                where=where,
            )
        return instance

    def mismatch(self, cls: Any) -> str | None:
        """Why ``cls`` is not a ``base`` (the end of a sentence naming it), or None."""
        base = import_object(self.base, what=f"the {self.kind} base", where=self.base)
        if not inspect.isclass(cls):
            return f"is a {type(cls).__name__}, not a class; point it at a {base.__name__} class"
        if _is_protocol(base):
            return _method_mismatch(cls, base)
        if not issubclass(cls, base):
            return f"is not a subclass of {base.__module__}.{base.__qualname__}; subclass it"
        if inspect.isabstract(cls):
            missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
            return f"is abstract; implement {missing}"
        return None


def _is_protocol(base: type) -> bool:
    return bool(getattr(base, "_is_protocol", False))


def _protocol_attributes(base: type) -> list[str]:
    """The data attributes a protocol ``base`` declares (none for a base class)."""
    return list(inspect.get_annotations(base)) if _is_protocol(base) else []


def _method_mismatch(cls: type, protocol: type) -> str | None:
    """Why ``cls`` does not implement the methods of ``protocol`` with its arguments, or None."""
    for name, method in vars(protocol).items():
        if not inspect.isfunction(method) or (name.startswith("_") and name != "__call__"):
            continue
        arguments = list(inspect.signature(method).parameters)[1:]
        wanted = f"{name}(self, {', '.join(arguments)})"
        own = next((vars(klass)[name] for klass in cls.__mro__[:-1] if name in vars(klass)), None)  # not object's
        if not callable(own):
            return f"has no method {wanted}; implement it"
        try:
            inspect.signature(own).bind(cls, *arguments)
        except TypeError:
            taken = ", ".join(inspect.signature(own).parameters)
            return f"has {name}({taken}), which cannot be called as {wanted}; give it those arguments"
    return None
