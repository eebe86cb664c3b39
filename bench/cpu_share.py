"""CPU seconds of a process tree, sampled from ``/proc`` while it runs (Linux only).

Wall-clock comparisons on a shared machine drift by more than the overheads they look for; the
CPU a run's other processes take while a training stage runs is what the stage competes with.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

TICK = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, CPU seconds so far, command line) of every readable process."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        found[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, command)
    return found


@dataclass
class TreeSampler:
    """Samples the CPU seconds of ``root`` and its descendants every ``interval`` seconds."""

    root: int
    interval: float = 0.5
    samples: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # pid -> [(time, cpu)]
    commands: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> TreeSampler:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            now, table = time.monotonic(), _processes()
            tree, grew = {self.root}, True
            while grew:
                children = {pid for pid, (parent, _, _) in table.items() if parent in tree} - tree
                tree |= children
                grew = bool(children)
            for pid in tree & table.keys():
                self.samples.setdefault(pid, []).append((now, table[pid][1]))
                self.commands.setdefault(pid, table[pid][2])
            self._stop.wait(self.interval)

    def lifetime(self, marker: str) -> tuple[int, float, float] | None:
        """(pid, first seen, last seen) of the process whose command line contains ``marker``."""
        for pid, command in self.commands.items():
            if marker in command:
                return pid, self.samples[pid][0][0], self.samples[pid][-1][0]
        return None

    def cpu_between(self, start: float, end: float, *, only: set[int] | None = None) -> float:
        """CPU seconds the sampled processes (or ``only`` those) used between ``start`` and ``end``."""
        total = 0.0
        for pid, points in self.samples.items():
            if only is not None and pid not in only:
                continue
            before = [cpu for t, cpu in points if t <= start]
            upto = [cpu for t, cpu in points if t <= end]
            if upto:
                total += upto[-1] - (before[-1] if before else 0.0)
        return total
