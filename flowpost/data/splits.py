"""The held-out split of a source, chosen per item by a hash of its name: stable as items come and go."""

from __future__ import annotations

import hashlib


def held_out(name: str, fraction: float, *, seed: int) -> bool:
    """Whether item ``name`` belongs to the ``fraction`` held out for evaluation under ``seed``."""
    digest = hashlib.sha256(f"{seed}\0{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction
