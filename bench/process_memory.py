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
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
