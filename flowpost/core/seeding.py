"""Seeded initialisation through torch's process-global RNG, safe across threads."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_GLOBAL_RNG_LOCK = threading.Lock()


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with the global CPU RNG seeded to ``seed``; its state is restored after.

    The global RNG is shared by every thread (Prefect runs tasks in threads), so one lock
    serialises these blocks: two seeded initialisations never interleave their draws.
    """
    with _GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
