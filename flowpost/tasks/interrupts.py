"""SIGINT and SIGTERM stop a run: its stages' process groups, then every process it started, then itself."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import psutil

from flowpost.core.processes import end_processes
from flowpost.tasks.train import stop_stages

SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_SECONDS = 5.0


@contextmanager
def stop_run_on_signals() -> Iterator[None]:
    """While inside (in the main thread), SIGINT or SIGTERM stops the run and exits 128 + the signal.

    The stages are stopped first (each checkpoints at its next step or is killed after 10 s),
    then the processes this one started (a temporary Prefect server); a second signal meanwhile
    is ignored. Nothing else runs: the next run resumes from the stages' last checkpoints.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _stop) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop(signum: int, frame: FrameType | None) -> None:
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    logging.disable(logging.CRITICAL)  # the stopped tasks' failures are no news
    name, started = signal.Signals(signum).name, time.monotonic()
    _say(f"{name} received: stopping the run's training stages and the processes it started")
    stop_stages()
    stop_children()
    _say(f"stopped in {time.monotonic() - started:.1f} s; run it again to resume from the stages' last checkpoints")
    os._exit(128 + signum)


def stop_children(grace: float = GRACE_SECONDS) -> None:
    """SIGTERM every descendant of this process, SIGKILL those still alive after ``grace`` seconds."""
    end_processes(psutil.Process().children(recursive=True), grace)


def _say(line: str) -> None:
    """Straight to file descriptor 2: not through ``print`` (a flow's ``log_prints`` takes it over)."""
    sys.stdout.flush()
    os.write(2, f"flowpost: {line}\n".encode())
