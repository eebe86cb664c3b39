"""Import ``"package.module:attribute"`` strings when used; construct what they name from config options."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterable
from difflib import get_close_matches
from typing import Any

from flowpost.errors import FlowpostError

PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # package.module:Class


def import_object(path: str, *, what: str, where: str) -> Any:
    """The attribute named by ``"package.module:attribute"`` (``what`` it is, for errors); a malformed path,
    a module that fails to import and a missing attribute are errors naming ``where``."""
    if not PATH.fullmatch(path):
        raise FlowpostError(
            f"{what}: {path!r} is not a package.module:Class path; write it as e.g. my_package.scores:Sharpness",
            where=where,
        )
    module_name, _, attribute = path.partition(":")
    try:
        value = importlib.import_module(module_name)
    except Exception as exc:  # a plugin's own code may raise anything while it is imported
        raise FlowpostError(
            f"{what}: importing {module_name!r} failed ({type(exc).__name__}: {exc}); install the package that "
            "provides it, or fix the module path before the colon",
            where=where,
        ) from exc
    for part in attribute.split("."):
        if not hasattr(value, part):
            close = get_close_matches(part, [name for name in dir(value) if not name.startswith("_")], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise FlowpostError(
                f"{what}: {module_name!r} has no attribute {attribute!r}{hint}; fix the name after the colon",
                where=where,
            )
        value = getattr(value, part)
    return value


def unknown_name(kind: str, name: str, known: Iterable[str], *, plural: str | None = None) -> str:
    """``unknown <kind> 'name' (did you mean 'x'?); known <kinds>: a, b`` for a name no registry holds."""
    names = sorted(known)
    close = get_close_matches(name.lower(), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {kind} {name!r}{hint}; known {plural or kind + 's'}: {', '.join(names)}"


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
