from __future__ import annotations

import numpy as np
import pytest
import torch

from flowpost.data.loaders import DemonstrationDataset, FiniteLoader, epoch_batches
from flowpost.data.records import Demonstration


def test_ranks_get_equal_batches_and_cover_global_batches() -> None:
    n, g, w = 103, 12, 4
    per_rank = [epoch_batches(n, global_batch_size=g, seed=3, epoch=0, rank=r, world_size=w) for r in range(w)]
    assert {len(b) for b in per_rank} == {n // g}
    single = epoch_batches(n, global_batch_size=g, seed=3, epoch=0)
    for b, global_batch in enumerate(single):
        assert sum((per_rank[r][b] for r in range(w)), []) == global_batch
        assert all(len(per_rank[r][b]) == g // w for r in range(w))
    flat = [i for batch in single for i in batch]
    assert len(set(flat)) == len(flat) == (n // g) * g


def test_deterministic_and_epochs_differ() -> None:
    a = epoch_batches(50, global_batch_size=10, seed=1, epoch=0)
    assert a == epoch_batches(50, global_batch_size=10, seed=1, epoch=0)
    assert a != epoch_batches(50, global_batch_size=10, seed=1, epoch=1)
    assert a != epoch_batches(50, global_batch_size=10, seed=2, epoch=0)


def test_indivisible_global_batch_is_rejected() -> None:
    with pytest.raises(ValueError, match="multiple of world_size"):
        epoch_batches(50, global_batch_size=10, seed=0, epoch=0, world_size=3)


def make_dataset(n: int) -> DemonstrationDataset:
    return DemonstrationDataset(
        [
            Demonstration(
                key=f"k{i}",
                prompt=f"p{i}",
                image=np.full((1, 4, 4), i / n, np.float32),
                label=i % 10,
            )
            for i in range(n)
        ]
    )


def test_loader_batches_and_resume_cursor() -> None:
    loader = FiniteLoader(make_dataset(23), global_batch_size=6, seed=0, rank=1, world_size=2)
    assert loader.batches_per_epoch == 3
    full = list(loader.iter_epoch(2))
    assert len(full) == 3
    first = full[0]
    assert first["image"].shape == (3, 1, 4, 4) and first["image"].dtype == torch.float32
    assert first["prompt"] == [f"p{i}" for i in first["index"].tolist()]
    assert first["label"].tolist() == [i % 10 for i in first["index"].tolist()]
    resumed = list(loader.iter_epoch(2, start_batch=1))
    assert [b["index"].tolist() for b in resumed] == [b["index"].tolist() for b in full[1:]]
    assert list(loader.iter_epoch(2, start_batch=3)) == []
    with pytest.raises(ValueError, match="start_batch"):
        list(loader.iter_epoch(2, start_batch=4))
