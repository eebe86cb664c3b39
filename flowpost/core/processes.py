"""Ending processes: SIGTERM first, SIGKILL for those still alive after a grace period."""

from __future__ import annotations

import psutil


def end_processes(processes: list[psutil.Process], grace: float) -> None:
    """SIGTERM ``processes``, then SIGKILL those still alive after ``grace`` seconds."""
    for process in processes:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
