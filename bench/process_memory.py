"""This process's resident memory on Linux: now, and its peak since the last reset (``/proc/self``)."""

from __future__ import annotations

from pathlib import Path

import psutil


def resident() -> int:
    """Bytes resident now."""
    return psutil.Process().memory_info().rss


def reset_peak() -> None:
    """Start the peak over from what is resident now (``VmHWM``)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak() -> int:
    """The most bytes resident since the last ``reset_peak`` (or the process's start)."""
    return status_bytes("VmHWM")


def mapped_resident() -> int:
    """Bytes resident now that are pages of files or shared memory (library code, mapped files), not allocations."""
    return status_bytes("RssFile") + status_bytes("RssShmem")


def mapped_files(suffix: str) -> int:
    """Bytes of the files mapped whole whose path ends with ``suffix``, resident or not (``.safetensors``: weights
    that a loader mapped rather than copied; the kernel pages in only what the steps read, where a GPU holds all)."""
    total, name = 0, ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and not fields[0].endswith(":"):  # a mapping's header: range, perms, offset, dev, inode[, path]
            name = fields[5] if len(fields) > 5 else ""
        elif fields[:1] == ["Size:"] and name.endswith(suffix):
            total += int(fields[1]) * 1024
    return total


def anonymous() -> int:
    """Bytes resident now that the process allocated (``RssAnon``): tensors, the Python heap, allocator slack."""
    return status_bytes("RssAnon")


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")
