"""One run at a time per workspace: ``flowpost run`` and ``flowpost run-node`` hold an exclusive lock on it.

The lock is an ``flock`` on ``WORKSPACE/.flowpost.lock``, a file that also names its holder (pid,
host, start time, command). The kernel releases it when the holder exits, however it exits
(SIGTERM and SIGKILL included), so a lock whose holder is dead is taken over. The process holding
it may take it again (the CLI and the flow it starts); another process is refused at once. The
stage processes a run starts do not take it, and on a multi-machine stage only machine 0 does
(the other machines join machine 0's run).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flowpost.core.logging import get_logger
from flowpost.core.process_group import Topology
from flowpost.errors import FlowpostError
from flowpost.tasks.workspace import checked_workspace

log = get_logger(__name__)
LOCK_FILE = ".flowpost.lock"
_held: dict[Path, list[int]] = {}  # lock file -> [descriptor, depth] of the locks this process holds
_guard = threading.Lock()


@contextlib.contextmanager
def workspace_lock(workspace: str | Path, command: str) -> Iterator[None]:
    """Hold ``workspace``'s lock for ``command`` (e.g. ``flowpost run``); a FlowpostError naming the
    holder if another process holds it."""
    if Topology.from_env().machine_rank != 0:
        yield
        return
    path = checked_workspace(workspace) / LOCK_FILE
    with _guard:
        entry = _held.setdefault(path, [-1, 0])
        if entry[1] == 0:
            try:
                entry[0] = _acquire(path, command)
            except BaseException:
                del _held[path]
                raise
        entry[1] += 1
    try:
        yield
    finally:
        with _guard:
            entry[1] -= 1
            if entry[1] == 0:
                del _held[path]
                os.ftruncate(entry[0], 0)  # names no holder once released
                os.close(entry[0])  # closing the descriptor releases the flock


def _acquire(path: Path, command: str) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise FlowpostError(f"cannot open the workspace lock ({exc.strerror})", where=str(path)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _holder(fd)
        os.close(fd)
        if not isinstance(exc, BlockingIOError):
            raise FlowpostError(f"cannot lock the workspace ({exc.strerror})", where=str(path)) from None
        raise _busy(path, holder) from None
    if previous := _holder(fd):
        log.warning("taking over the workspace lock %s from %s, which has ended", path, _describe(previous))
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return fd


def refuse_if_busy(workspace: str | Path) -> None:
    """Raise what ``workspace_lock`` would when another process holds ``workspace``'s lock, creating
    nothing: a command can then check its other inputs before the lock writes its file."""
    path = checked_workspace(workspace) / LOCK_FILE
    if Topology.from_env().machine_rank != 0 or path in _held:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file yet (nobody holds it), or one ``workspace_lock`` reports itself
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released with the descriptor
    except BlockingIOError:
        raise _busy(path, _holder(fd)) from None
    finally:
        os.close(fd)


def _busy(path: Path, holder: dict[str, Any] | None) -> FlowpostError:
    return FlowpostError(
        f"in use by {_describe(holder)}; wait for it to end (or stop it), then run again", where=str(path.parent)
    )


def _holder(fd: int) -> dict[str, Any] | None:
    """The holder a lock file names, or None when it names none (or is being written)."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"null")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _describe(holder: dict[str, Any] | None) -> str:
    """``flowpost run (pid 123 on host a, started 2025-01-01T03:00:00+00:00)``, or ``another process``."""
    if holder is None:
        return "another process"
    return (
        f"`{holder.get('command', 'flowpost')}` (pid {holder.get('pid')} on host {holder.get('host')}, "
        f"started {holder.get('started')})"
    )
