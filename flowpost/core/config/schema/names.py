"""Names of pipeline entries (datasets, caches, stages) and the message for a reference to an undefined one."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from pydantic import Field, StringConstraints

NAME_PATTERN = r"^[a-z][a-z0-9_-]*$"
Name = Field(pattern=NAME_PATTERN)
Key = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
INIT_KEYWORDS = ("scratch", "previous")  # model.init values that are not stage names


def unknown(kind: str, value: str, allowed: Iterable[str]) -> str:
    """``unknown <kind> 'value'; allowed: ...``: what is defined instead."""
    return f"unknown {kind} {value!r}; allowed: {', '.join(sorted(allowed)) or 'none defined'}"
