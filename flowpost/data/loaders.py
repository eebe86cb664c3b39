"""Finite, rank-aware, map-style loading with an exact resume cursor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import Dataset

from flowpost.data.records import Demonstration, PreferencePair


class MapDataset(Protocol):
    """What FiniteLoader reads: a sized dataset of per-sample dicts."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict[str, Any]: ...


class DemonstrationDataset(Dataset):
    """Demonstrations as dicts of ``image`` (float32 [C, H, W]), ``prompt``, ``label``, ``index``.

    A record without a label gets ``label`` -1.
    """

    def __init__(self, records: list[Demonstration]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self.records[index]
        return {
            "image": torch.from_numpy(record.image).to(torch.float32),
            "prompt": record.prompt,
            "label": -1 if record.label is None else int(record.label),
            "index": index,
        }


class PreferencePairDataset(Dataset):
    """Preference pairs as dicts of ``chosen`` and ``rejected`` (float32 [C, H, W]), ``prompt``, ``label``,
    ``index``; a record without a label gets ``label`` -1."""

    def __init__(self, records: list[PreferencePair]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self.records[index]
        return {
            "chosen": torch.from_numpy(record.chosen).to(torch.float32),
            "rejected": torch.from_numpy(record.rejected).to(torch.float32),
            "prompt": record.prompt,
            "label": -1 if record.label is None else int(record.label),
            "index": index,
        }


class CachedLatents(Dataset):
    """A dataset read from a latent cache: each arm (``image``, or ``chosen`` and ``rejected``) comes as
    ``<arm>_latents``, so trainers use it as the model's latent instead of encoding the media."""

    def __init__(self, dataset: MapDataset, arms: tuple[str, ...]) -> None:
        self.dataset = dataset
        self.arms = arms

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.dataset[index]
        return {**item, **{f"{arm}_latents": item.pop(arm) for arm in self.arms}}


def epoch_batches(
    num_samples: int,
    *,
    global_batch_size: int,
    seed: int,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
) -> list[list[int]]:
    """This rank's sample indices for each full global batch of a seeded per-epoch permutation.

    The trailing partial global batch is dropped, so every rank gets the same number of batches.
    """
    _check_layout(global_batch_size, rank, world_size)
    generator = torch.Generator().manual_seed(_epoch_seed(seed, epoch))
    perm = torch.randperm(num_samples, generator=generator).tolist()
    per_rank = global_batch_size // world_size
    return [
        perm[start + rank * per_rank : start + (rank + 1) * per_rank]
        for start in range(0, num_samples - global_batch_size + 1, global_batch_size)
    ]


def _check_layout(global_batch_size: int, rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is out of range for world_size {world_size}")
    if global_batch_size < 1 or global_batch_size % world_size:
        raise ValueError(
            f"global_batch_size {global_batch_size} must be a positive multiple of world_size {world_size}"
        )


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919 + 12_345) % (2**63 - 1)


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack tensors (images), make integers (labels, indices) a long tensor; keep strings (prompts) as a list."""
    batch: dict[str, Any] = {}
    for key, first in items[0].items():
        values = [item[key] for item in items]
        if isinstance(first, torch.Tensor):
            batch[key] = torch.stack(values)
        elif isinstance(first, int):
            batch[key] = torch.tensor(values, dtype=torch.long)
        else:
            batch[key] = values
    return batch


class FiniteLoader:
    """Iterates this rank's batches of a map-style dataset, one epoch at a time."""

    def __init__(
        self,
        dataset: MapDataset,
        *,
        global_batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.dataset = dataset
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        _check_layout(global_batch_size, rank, world_size)

    @property
    def batches_per_epoch(self) -> int:
        return len(self.dataset) // self.global_batch_size

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[dict[str, Any]]:
        """Yield collated batches of ``epoch`` from cursor ``start_batch`` (batches consumed)."""
        if not 0 <= start_batch <= self.batches_per_epoch:
            raise ValueError(f"start_batch {start_batch} is outside 0..{self.batches_per_epoch} for this epoch")
        batches = epoch_batches(
            len(self.dataset),
            global_batch_size=self.global_batch_size,
            seed=self.seed,
            epoch=epoch,
            rank=self.rank,
            world_size=self.world_size,
        )
        for indices in batches[start_batch:]:
            yield collate([self.dataset[i] for i in indices])
