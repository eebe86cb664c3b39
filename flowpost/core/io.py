"""Atomic file and directory writes, content hashes, and write failures reported by the file they hit."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from safetensors import SafetensorError

_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)
_NETWORK_ERRORS = (ConnectionError, TimeoutError)  # transient: a retry may pass
_WHAT_TO_DO = "check the path, free space on the disk or make the folder writable, then run it again"
_OS_ERROR_CODE = re.compile(r"os error (\d+)|code: (\d+)")  # safetensors' "... (os error 28)" or "Os { code: 28"


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def hash_mismatch(root: str | Path, hashes: dict[str, str]) -> str | None:
    """None when each file named in ``hashes`` (relative to ``root``) has its recorded SHA-256, else why not."""
    for name, digest in hashes.items():
        path = Path(root) / name
        if not path.is_file():
            return f"{name} is missing"
        if sha256_file(path) != digest:
            return f"{name} does not match its recorded sha256"
    return None


def sha256_json(value: Any) -> str:
    """Hex SHA-256 of a JSON-serialisable value in canonical form (sorted keys)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _umask() -> int:
    """The process umask, read without changing it where ``/proc`` allows (other threads may be writing)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as status:
            return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Yield a handle on a temporary sibling of ``path``; on success it is synced and renamed to ``path``.

    The file gets the mode ``open`` would give it (``0o666`` less the umask), not ``mkstemp``'s
    ``0o600``. On failure the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if (named := _naming_final(_as_os_error(exc), path)) is not None:
            raise named from exc
        raise


def check_output_file(path: str | Path, *, where: str, example: str = "grid.png") -> None:
    """Raise a FlowpostError unless ``path`` can be written as a file: not a folder, nor under a file,
    nor in a folder this process cannot write; the message for a folder suggests ``path / example``."""
    from flowpost.errors import FlowpostError

    path = Path(path)
    if path.is_dir():
        raise FlowpostError(f"{path} is a folder; give a file path, e.g. {path / example}", where=where)
    parent = next(p for p in path.absolute().parents if p.exists())
    if not parent.is_dir():
        message = f"{parent} is a file, so {path} cannot be written under it; choose another path"
        raise FlowpostError(message, where=where)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FlowpostError(f"cannot write in {parent} (read-only or not yours); choose another path", where=where)


def write_json_atomic(path: str | Path, value: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename."""
    with atomic_file(path, "w") as handle:
        json.dump(value, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write bytes to ``path`` through a temporary file and a rename."""
    with atomic_file(path, "wb") as handle:
        handle.write(data)


@contextlib.contextmanager
def atomic_directory(final: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``final`` by rename.

    An existing ``final`` is first renamed aside, the new directory is renamed in, and only
    then is the old one deleted: at every moment one complete version is in place or aside.
    The directory gets the mode ``mkdir`` would give it (``0o777`` less the umask), not
    ``mkdtemp``'s ``0o700``. On failure the temporary directory is removed and ``final`` is left as
    it was.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        old = None
        if final.exists():
            old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".old"))
            os.replace(final, old)  # an empty directory is replaced by rename
        try:
            os.replace(tmp, final)
        except BaseException:
            if old is not None:
                os.replace(old, final)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if (named := _naming_final(_as_os_error(exc), final)) is not None:
            raise named from exc
        raise


def _as_os_error(exc: BaseException) -> BaseException:
    """``exc``, or the OSError (naming no file) a safetensors write or read failure stands for: safetensors
    raises its own error type for a full disk, with the OS error only in its text."""
    found = _OS_ERROR_CODE.search(str(exc)) if isinstance(exc, SafetensorError) else None
    if found is None:
        return exc
    number = int(found.group(1) or found.group(2))
    return OSError(number, os.strerror(number))


def unwritable(folder: str | Path) -> str | None:
    """None when a small file can be written, synced and removed in ``folder`` (or its nearest existing
    parent), else the reason it cannot (``Read-only file system``, ``No space left on device``)."""
    folder = Path(folder).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.is_dir())
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".flowpost-probe.") as probe:
            probe.write(bytes(4096))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def check_writable_workspace(workspace: str | Path) -> None:
    """A FlowpostError naming ``workspace`` when a small file cannot be written in it (a read-only or full disk)."""
    from flowpost.errors import FlowpostError

    if (why := unwritable(workspace)) is not None:
        raise FlowpostError(
            f"the workspace cannot be written ({why}); make it writable or free space on its disk, or pass another "
            "folder with --workspace",
            where=str(workspace),
        )


def _naming_final(exc: BaseException, final: Path) -> OSError | None:
    """When ``exc`` is an OS error that names no file or a temporary sibling of ``final`` (or a file
    inside one), the same error naming the path it stands for under ``final``; else None."""
    if not isinstance(exc, OSError) or isinstance(exc, _NETWORK_ERRORS) or exc.errno is None:
        return None
    if exc.filename is None:
        return OSError(exc.errno, exc.strerror, str(final))
    name = Path(os.fsdecode(exc.filename))
    for folder in (name, *name.parents):
        temporary = folder.name.startswith(f".{final.name}.") and folder.name.endswith((".tmp", ".old"))
        if temporary and folder.parent == final.parent:
            return OSError(exc.errno, exc.strerror, str(final / name.relative_to(folder)))
    return None


@contextlib.contextmanager
def file_errors_reported(action: str, *, where: str | Path) -> Iterator[None]:
    """Re-raise a file-system error inside (a full disk, a read-only folder, a path under a file) as a
    FlowpostError naming the file (``where`` when the error names none) and what to do.

    Errors of the network (a refused connection, a timeout) pass through unchanged: a retry may pass.
    """
    from flowpost.errors import FlowpostError

    try:
        yield
    except SafetensorError as exc:  # its own type for a full disk; the file is not named
        error = _as_os_error(exc)
        if not isinstance(error, OSError):
            raise
        raise FlowpostError(f"{action} failed ({error.strerror}); {_WHAT_TO_DO}", where=os.fsdecode(where)) from exc
    except shutil.Error as exc:  # copytree gathers (source, destination, why) of each file that failed
        failures = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
        _, target, why = failures[0] if failures else (None, where, str(exc))
        reason = re.match(r"\[Errno \d+\] ([^:]+)", why)  # "[Errno 28] No space left on device: 'path'"
        raise FlowpostError(
            f"{action} failed ({reason.group(1) if reason else why}); {_WHAT_TO_DO}", where=str(target)
        ) from exc
    except OSError as exc:
        if isinstance(exc, _NETWORK_ERRORS) or (exc.filename is None and exc.errno not in _DISK_ERRNOS):
            raise
        target = exc.filename2 or exc.filename or where
        raise FlowpostError(
            f"{action} failed ({exc.strerror or exc}); {_WHAT_TO_DO}", where=os.fsdecode(target)
        ) from exc


def read_json(path: str | Path, *, what: str = "file") -> Any:
    """Read JSON, turning a missing or malformed file into a FlowpostError naming it."""
    from flowpost.errors import FlowpostError

    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FlowpostError(f"{what} not found; was the step that writes it run?", where=str(path)) from None
    except json.JSONDecodeError as exc:
        raise FlowpostError(f"{what} is not valid JSON ({exc.msg} at line {exc.lineno})", where=str(path)) from None
    except UnicodeDecodeError:
        raise FlowpostError(f"{what} is not UTF-8 text", where=str(path)) from None


def read_json_object(path: str | Path, *, what: str = "file") -> dict[str, Any]:
    """``read_json`` of a file that must hold one JSON object (a manifest, a record)."""
    from flowpost.errors import FlowpostError

    value = read_json(path, what=what)
    if not isinstance(value, dict):
        raise FlowpostError(f"{what} holds a JSON {type(value).__name__}, not an object", where=str(path))
    return value
