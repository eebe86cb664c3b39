"""Addressable randomness: every draw comes from a generator seeded by where it is used.

A sample's noise depends only on (seed, stage, step, global sample index, purpose), never on
the batch it happens to share, the world size, or how many draws came before it; a resume needs
only the counters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor


def address_seed(seed: int, stage: str, step: int, index: int, purpose: str = "noise") -> int:
    """A 63-bit generator seed for one (seed, stage, step, sample index, purpose) address."""
    key = f"{seed}/{stage}/{step}/{index}/{purpose}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)


def addressed_generator(seed: int, stage: str, step: int, index: int, purpose: str = "noise") -> torch.Generator:
    return torch.Generator().manual_seed(address_seed(seed, stage, step, index, purpose))


def addressed_randn(
    shape: Sequence[int],
    *,
    seed: int,
    stage: str,
    step: int,
    indices: Sequence[int],
    purpose: str = "noise",
) -> Tensor:
    """Standard normals [len(indices), *shape]; row i depends only on its address."""
    rows = [
        torch.randn(tuple(shape), generator=addressed_generator(seed, stage, step, int(i), purpose)) for i in indices
    ]
    return torch.stack(rows) if rows else torch.empty((0, *shape))


def addressed_rand(
    shape: Sequence[int], *, seed: int, stage: str, step: int, indices: Sequence[int], purpose: str
) -> Tensor:
    """Uniforms in [0, 1) [len(indices), *shape]; row i depends only on its address."""
    rows = [
        torch.rand(tuple(shape), generator=addressed_generator(seed, stage, step, int(i), purpose)) for i in indices
    ]
    return torch.stack(rows) if rows else torch.empty((0, *shape))
