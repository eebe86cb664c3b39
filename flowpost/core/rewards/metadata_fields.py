"""The metadata fields a reward reads from every prompt: a reward class lists them in ``metadata_fields``, and a
dataset whose prompt lacks one is refused as the stage or the evaluation loads it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flowpost.errors import FlowpostError


def metadata_fields(reward_class: Any) -> tuple[str, ...]:
    """The fields ``reward_class`` declares in ``metadata_fields`` (none when it declares none)."""
    return tuple(getattr(reward_class, "metadata_fields", ()))


def check_metadata_fields(
    name: str, fields: tuple[str, ...], rows: Iterable[tuple[str, dict[str, Any]]], *, dataset: str, where: str
) -> None:
    """Refuse the first ``(prompt, metadata)`` row missing one of ``fields``, naming the reward, the dataset,
    the prompt and the field."""
    for prompt, metadata in rows:
        if missing := [field for field in fields if field not in metadata]:
            raise FlowpostError(
                f"reward {name!r} reads the metadata field {missing[0]!r} of every prompt, and prompt {prompt!r} of "
                f"dataset {dataset!r} has none; add a {missing[0]!r} field to its rows, or score another dataset",
                where=where,
            )
