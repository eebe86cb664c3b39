"""Tally of the items acquisition skipped, per kind, and the threshold past which it fails instead."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowpost.data.sources.items import BAD_KINDS
from flowpost.errors import FlowpostError

NAMED = 5  # how many skipped items the manifest and the error name


@dataclass
class BadItems:
    """Counts per ``BAD_KINDS`` kind, the first few items (``kind: where: why``) and the items seen."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BAD_KINDS, 0))
    first: list[str] = field(default_factory=list)
    seen: int = 0

    def add(self, kind: str, where: str, detail: str) -> None:
        self.counts[kind] += 1
        if len(self.first) < NAMED:
            self.first.append(f"{kind}: {where}: {detail}")

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def check(self, max_fraction: float, *, where: str) -> None:
        """Raise naming the first bad items when more than ``max_fraction`` of the items are bad, or all are."""
        if self.seen and self.total <= max_fraction * self.seen and self.total < self.seen:
            return
        raise FlowpostError(
            f"{self.total} of {self.seen} items are bad, more than max_bad_fraction {max_fraction} allows "
            f"({', '.join(f'{k} {n}' for k, n in self.counts.items() if n)}); first: {'; '.join(self.first)}. "
            "Fix or remove them, or raise max_bad_fraction",
            where=where,
        )

    def manifest(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "total": self.total, "first": list(self.first)}
