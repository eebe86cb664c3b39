"""Text encoders whose outputs the condition cache stores: a plugin kind (entry point group
``flowpost.encoders``), named by ``conditions.<name>.encoder``."""

from __future__ import annotations

from typing import Protocol

from flowpost.core.conditions import ConditionBatch
from flowpost.core.plugins import Registry, is_path

ENCODERS: dict[str, str] = {}  # none built in: the tiny family's ``minilm`` comes with the digits extra
ENCODER_REGISTRY = Registry(
    "encoder",
    plural="encoders",
    group="flowpost.encoders",
    builtins=ENCODERS,
    base="flowpost.core.models.text_encoders:ConditionEncoder",
)


class ConditionEncoder(Protocol):
    """What fills a condition cache: prompts to a ``ConditionBatch``, and a fingerprint keying the rows."""

    @property
    def fingerprint(self) -> str: ...

    def encode(self, prompts: list[str]) -> ConditionBatch: ...

    def release(self) -> None:
        """Free the loaded weights."""


def build_encoder(name: str, *, max_length: int, where: str = "conditions.*.encoder") -> ConditionEncoder:
    """The encoder registered under ``name``, encoding ``max_length`` tokens."""
    encoder: ConditionEncoder = ENCODER_REGISTRY.build(name, options={"max_length": max_length}, where=where)
    return encoder


def encoder_package(name: str) -> str | None:
    """The distribution shipping the weights of the registered encoder ``name`` (its class's ``package``, else
    the plugin declaring it); None when no encoder is registered as ``name`` (a family's own encoders)."""
    entry = ENCODER_REGISTRY.entries(where="conditions.*.encoder").get(name)
    if entry is None:
        return None
    cls = ENCODER_REGISTRY.load(name, where="conditions.*.encoder")
    return getattr(cls, "package", None) or entry.plugin or name


def same_encoder(first: str, second: str, *, where: str) -> bool:
    """Whether two encoder names name one class: the same name, or a registered name and a class path (or two
    names) importing the same class. A family's own text encoders go by the family's name, which is no encoder."""
    if first == second:
        return True
    entries = ENCODER_REGISTRY.entries(where=where)
    targets = [name if is_path(name) else entries[name].target if name in entries else None for name in (first, second)]
    return targets[0] is not None and targets[0] == targets[1]
