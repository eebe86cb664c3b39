"""Registries map names to ``"module:attribute"`` strings, imported only when used."""

from __future__ import annotations

import importlib
from typing import Any


def import_object(path: str) -> Any:
    """The attribute named by ``"package.module:attribute"``."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)
