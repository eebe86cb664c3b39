"""Folders and files that really cannot be written, for tests of write failures.

Root ignores permission bits, so ``read_only`` uses ``chattr +i`` (the immutable flag) when the tests
run as root and ``chmod 0555`` otherwise, and checks that a write there fails. ``file_size_limit``
lowers ``RLIMIT_FSIZE``: the kernel then fails every write past the limit, as a full disk does.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` unwritable for this process (root included) inside the block."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(folder)], check=True, capture_output=True)
        undo = ["chattr", "-i", str(folder)]
    else:
        folder.chmod(0o555)
        undo = ["chmod", "755", str(folder)]
    try:
        with pytest.raises(OSError):
            (folder / "probe").write_text("")  # the mechanism works here
        yield
    finally:
        subprocess.run(undo, check=True)


@contextlib.contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """Writes past ``size`` bytes of any file fail (``EFBIG``; Python ignores ``SIGXFSZ``) inside the block."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "256k") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``folder`` inside the block (root only, as on this project's machines and
    CI; elsewhere the test fails saying so): writes past it fail with ``ENOSPC``, as on a full disk. It is
    unmounted afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.fail(f"a full-disk test mounts a tmpfs, which needs root: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(folder: Path) -> None:
    """Write into ``folder`` until its disk is full."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, bytes(4096)):
                pass
    finally:
        os.close(fd)
