"""Why a stage stops before its budget: a request (SIGTERM) at its next budget-unit boundary, with a
checkpoint there; or its guard, at the last checkpoint that passed."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowpost.core.evaluation.guard import GuardCheck, StageGuard

_requested: list[signal.Signals] = []


class StageStopped(Exception):  # noqa: N818 - a requested stop, not an error
    """Raised by the loop once every rank saw the stop request and a checkpoint holds the progress."""

    def __init__(self, stage: str, position: str, signum: signal.Signals) -> None:
        self.signum = signum
        super().__init__(f"stage {stage!r} stopped by {signum.name} at {position}, checkpoint saved")


class GuardFired(Exception):  # noqa: N818 - the guard's verdict, not an error
    """Raised by the loop when a guard check fails; the stage then ends with ``last_good``'s checkpoint."""

    def __init__(self, stage: str, guard: StageGuard, check: GuardCheck, last_good: GuardCheck) -> None:
        self.check = check
        self.last_good = last_good
        super().__init__(
            f"guard of stage {stage!r} fired at {guard.position(check)}: {'; '.join(check.violations)}; "
            f"the stage ends with its checkpoint of {guard.position(last_good)}"
        )


def stop_requested() -> signal.Signals | None:
    """The signal that asked this process to stop, if one did."""
    return _requested[0] if _requested else None


def _request(signum: int, frame: FrameType | None) -> None:
    _requested.append(signal.Signals(signum))


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM asks the loop to checkpoint and stop instead of killing the process."""
    previous = signal.signal(signal.SIGTERM, _request)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _requested.clear()
