"""``python -m flowpost.flows.watchdog PID``: when process PID ends, however it ends (SIGKILL included),
end the processes it started in its own session (a temporary Prefect server), then exit.

Stage processes run in sessions of their own and follow their parent themselves; they are left alone.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

from flowpost.core.processes import end_processes

POLL_SECONDS = 0.25
GRACE_SECONDS = 5.0


def watch(pid: int) -> None:
    """Remember PID's children in its session while it runs; once it has ended, SIGTERM them, then SIGKILL
    those still alive after ``GRACE_SECONDS``."""
    try:
        parent = psutil.Process(pid)
        session = os.getsid(pid)
    except (psutil.NoSuchProcess, ProcessLookupError):
        return
    seen: dict[int, psutil.Process] = {}
    while _alive(parent):
        try:
            for child in parent.children():
                if child.pid != os.getpid() and child.pid not in seen and os.getsid(child.pid) == session:
                    seen[child.pid] = child
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
        time.sleep(POLL_SECONDS)
    end_processes([child for child in seen.values() if child.is_running()], GRACE_SECONDS)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's to handle
    watch(int(sys.argv[1]))


if __name__ == "__main__":
    main()
