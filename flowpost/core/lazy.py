"""Registries map names to ``"module:attribute"`` strings, imported only when used."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from difflib import get_close_matches
from typing import Any

from flowpost.errors import FlowpostError


def import_object(path: str) -> Any:
    """The attribute named by ``"package.module:attribute"``."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def unknown_name(kind: str, name: str, known: Iterable[str], *, plural: str | None = None) -> str:
    """``unknown <kind> 'name' (did you mean 'x'?); known <kinds>: a, b`` for a name no registry holds."""
    names = sorted(known)
    close = get_close_matches(name.lower(), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {kind} {name!r}{hint}; known {plural or kind + 's'}: {', '.join(names)}"


def import_registered(registry: dict[str, str], name: str, *, kind: str, where: str, plural: str | None = None) -> Any:
    """The object registered as ``name``, or a clear error naming ``where`` and the close names."""
    if name not in registry:
        raise FlowpostError(unknown_name(kind, name, registry, plural=plural), where=where)
    return import_object(registry[name])


def construct(cls: Any, *, kind: str, name: str, options: dict[str, Any], where: str) -> Any:
    """``cls(**options)`` for the ``kind`` registered as ``name``; bad options name ``where`` and the accepted
    parameters, and a constructor's error whose ``where`` starts with ``options.`` is reported under ``where``."""
    signature = inspect.signature(cls)
    try:
        signature.bind(**options)
    except TypeError as exc:
        accepted = [
            parameter.name
            for parameter in signature.parameters.values()
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        ]
        raise FlowpostError(
            f"bad options for {kind} {name!r} ({exc}); accepted parameters: {', '.join(accepted) or 'none'}",
            where=where,
        ) from None
    try:
        return cls(**options)
    except FlowpostError as exc:
        if exc.where is None or not exc.where.startswith("options."):
            raise
        raise FlowpostError(str(exc).removeprefix(f"{exc.where}: "), where=f"{where}.{exc.where}") from None
