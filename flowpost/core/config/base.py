"""The strict pydantic base every config section uses."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Rejects unknown keys and non-finite floats (``.inf``, ``.nan``); validates defaults and assignments."""

    model_config = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True, allow_inf_nan=False)


def non_finite_keys(value: Any, prefix: str = "") -> list[str]:
    """Dotted keys under ``value`` (nested mappings and lists) that hold ``inf`` or ``nan``."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [prefix]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [key for name, item in items for key in non_finite_keys(item, f"{prefix}.{name}" if prefix else str(name))]
