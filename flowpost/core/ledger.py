"""The cost ledger of a training stage: wall time per phase, throughput and peak memory.

The loop owns one ``CostLedger`` and marks its phases at the boundaries it already has
(``with ledger.phase("rollout"):``). Phases nest: the time of an inner phase (a validation grid inside an
optimizer step, a checkpoint) is taken out of the outer one, so the phases are disjoint and their sum never
exceeds the stage's wall time; what no phase covers (resume, callbacks, events) is ``other_seconds``.

Timing never adds a device sync inside an inner loop. A phase opened with ``sync=True`` (the default: the
phases of a rollout iteration, evaluation, checkpoints) synchronises a CUDA device at its two boundaries,
once per phase; the dataset loop's per-micro-batch phases (``data``, ``optimize``) are opened with
``sync=False`` and time the host only: ``data`` is the time the loop waits in the loader, and the device
work queued before it may still run during that wait (the optimizer step's one read of the metrics syncs
the device once per step anyway).

Each rank measures its own; rank 0 writes the ledger. Peak memory is the maximum over ranks (one collective
at the end of the stage); times, samples and rates are rank 0's. ``state_dict`` goes into each checkpoint,
so a resumed stage's ledger covers the whole stage: the killed run's time up to its last checkpoint counts.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from flowpost.core.distributed import max_over_ranks

COST_FILE = "cost.json"  # under the stage's final/ folder
PHASES = ("rollout", "reward", "data", "optimize", "evaluation", "checkpoint")  # the order they are reported in
CUDA_MEMORY = "cuda_max_allocated"  # torch.cuda.max_memory_allocated of the stage's device
CPU_MEMORY = "cpu_peak_rss"  # the process's peak resident set size (getrusage ru_maxrss)


def peak_memory(device: torch.device) -> tuple[int, str]:
    """This process's peak memory on ``device`` in bytes, and which measure it is."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), CUDA_MEMORY
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), CPU_MEMORY  # bytes on macOS, KiB on Linux


class CostLedger:
    """Accumulates the phases, samples and peak memory of one stage (across resumes)."""

    def __init__(
        self, device: torch.device, *, world_size: int = 1, sample_kind: str = "samples", frames: int = 1
    ) -> None:
        self.device = device
        self.world_size = world_size
        self.sample_kind = sample_kind  # what a sample is: generated samples or training examples
        self.frames = frames  # images (1) or video frames per sample
        self.seconds: dict[str, float] = {}
        self.samples = 0  # over all ranks
        self.runs = 0  # this run and the earlier ones its checkpoints carry
        self._wall_before = 0.0  # the earlier runs' wall time, up to their last checkpoint
        self._peak_before = 0
        self._started: float | None = None
        self._open: list[list[Any]] = []  # [name, since] of each open phase, innermost last

    def start(self) -> None:
        """Start the stage's clock (once per run)."""
        self._started = time.perf_counter()
        self.runs += 1

    def _now(self, sync: bool) -> float:
        if sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str, *, sync: bool = True) -> Iterator[None]:
        """Time the block as phase ``name`` (exclusive of the phases opened inside it)."""
        now = self._now(sync)
        if self._open:
            outer = self._open[-1]
            self.seconds[outer[0]] = self.seconds.get(outer[0], 0.0) + now - outer[1]
        self._open.append([name, now])
        try:
            yield
        finally:
            now = self._now(sync)
            _, since = self._open.pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + now - since
            if self._open:
                self._open[-1][1] = now

    def count(self, samples: int) -> None:
        """Add ``samples`` (over all ranks) done."""
        self.samples += samples

    def wall_seconds(self) -> float:
        """The stage's wall time so far: the earlier runs' and this run's since ``start``."""
        return self._wall_before + (time.perf_counter() - self._started if self._started is not None else 0.0)

    def _phase_seconds(self) -> dict[str, float]:
        """The seconds of each phase so far, open phases included up to now."""
        seconds = dict(self.seconds)
        if self._open:  # only the innermost open phase is running
            name, since = self._open[-1]
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - since
        return seconds

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: everything so far (open phases up to now)."""
        return {
            "wall_seconds": self.wall_seconds(),
            "seconds": self._phase_seconds(),
            "samples": self.samples,
            "runs": self.runs,
            "peak_memory_bytes": max(self._peak_before, peak_memory(self.device)[0]),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a checkpoint's ledger (a checkpoint written before ledgers restores nothing)."""
        if not state:
            return
        self._wall_before = float(state["wall_seconds"])
        self.seconds = {str(k): float(v) for k, v in state["seconds"].items()}
        self.samples = int(state["samples"])
        self.runs += int(state["runs"])
        self._peak_before = int(state["peak_memory_bytes"])

    def summary(self) -> dict[str, Any]:
        """The ledger's record (``final/cost.json``, each stage's ``cost`` in ``metrics.json``); every rank
        calls it (peak memory is gathered over ranks once)."""
        wall = self.wall_seconds()
        seconds = self._phase_seconds()
        phases = {name: seconds[name] for name in [*PHASES, *sorted(set(seconds) - set(PHASES))] if name in seconds}
        peak, kind = peak_memory(self.device)
        peak = max_over_ranks(max(peak, self._peak_before), self.device)
        rate = self.samples / wall if wall > 0 else 0.0
        media = "frames" if self.frames > 1 else "images"
        return {
            "wall_seconds": wall,
            "phases": phases,
            "other_seconds": max(0.0, wall - sum(phases.values())),
            "samples": self.samples,
            "sample_kind": self.sample_kind,
            "samples_per_second": rate,
            f"{media}_per_gpu_per_second": rate * self.frames / self.world_size,
            "world_size": self.world_size,
            "peak_memory_bytes": peak,
            "memory_kind": kind,
            "runs": self.runs,
        }
