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


def mapped_tensors(suffix: str, storages: dict[int, int]) -> int:
    """Bytes of the live tensor storages (``storages``: address to size) that lie in files mapped whole whose path
    ends with ``suffix`` (``.safetensors``: weights that a loader mapped rather than copied, counted whole though
    the kernel pages in only what the steps read, as a GPU holds them; a file whose weights the loader converted
    to another dtype stays mapped for any small tensor it kept, which is all that counts)."""
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[5].endswith(suffix):
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            spans.append((start, end))
    return sum(size for address, size in storages.items() if any(a <= address < b for a, b in spans))


def anonymous() -> int:
    """Bytes resident now that the process allocated (``RssAnon``): tensors, the Python heap, allocator slack."""
    return status_bytes("RssAnon")


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")
