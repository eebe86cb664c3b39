"""How often each trainable role is updated: a round of updates, repeated."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoleUpdatePlan:
    """Per round, each role is updated ``count`` times, in the order given (e.g. the fake score
    ``ttur`` times, then the generator once)."""

    cadence: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        roles = [role for role, _ in self.cadence]
        if len(set(roles)) != len(roles):
            raise ValueError(f"each role appears once in an update plan, got {roles}")
        if any(count < 1 for _, count in self.cadence):
            raise ValueError(f"every role of an update plan is updated at least once per round, got {self.cadence}")

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(role for role, _ in self.cadence)

    def round(self) -> list[str]:
        """The roles of one round's updates, in order."""
        return [role for role, count in self.cadence for _ in range(count)]
