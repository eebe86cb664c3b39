"""Preference-pair shards: written and read back exactly, kept apart from demonstrations, damage named."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from flowpost.core.io import sha256_file
from flowpost.data.records import Demonstration, PreferencePair
from flowpost.data.shards import is_pair_manifest, read_pair_shards, read_shards, write_shards
from flowpost.errors import FlowpostError


def _pairs(count: int) -> list[PreferencePair]:
    rng = np.random.default_rng(0)
    return [
        PreferencePair(
            key=f"p{i}",
            prompt=f"digit {i % 3}",
            chosen=rng.random((1, 4, 4), dtype=np.float32),
            rejected=rng.random((1, 4, 4), dtype=np.float32),
            label=i % 3,
            metadata={"gap": i},
        )
        for i in range(count)
    ]


def test_pairs_round_trip_and_the_manifest_says_what_the_shards_hold(tmp_path: Path) -> None:
    pairs = _pairs(5)
    manifest = write_shards(pairs, tmp_path, shard_size=2)
    assert is_pair_manifest(manifest) and manifest["count"] == 5 and len(manifest["shards"]) == 3
    assert manifest["labels"] == {"digit 0": 0, "digit 1": 1, "digit 2": 2}
    back = read_pair_shards(tmp_path, manifest)
    assert [(p.key, p.prompt, p.label, p.metadata) for p in back] == [
        (p.key, p.prompt, p.label, p.metadata) for p in pairs
    ]
    assert all(
        np.array_equal(a.chosen, b.chosen) and np.array_equal(a.rejected, b.rejected)
        for a, b in zip(back, pairs, strict=True)
    )
    with pytest.raises(FlowpostError, match="not one of the demonstrations"):
        read_shards(tmp_path, manifest)


def test_a_shard_set_holds_one_kind_and_pairs_have_matching_shapes(tmp_path: Path) -> None:
    demo = Demonstration(key="d0", prompt="x", image=np.zeros((1, 4, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="not both"):
        write_shards([*_pairs(1), demo], tmp_path)
    assert not is_pair_manifest(write_shards([demo], tmp_path / "demos"))
    with pytest.raises(ValueError, match="differ in shape"):
        PreferencePair(
            key="k", prompt="x", chosen=np.zeros((1, 4, 4), np.float32), rejected=np.zeros((1, 2, 2), np.float32)
        )


def test_a_pair_without_its_rejected_image_names_the_shard(tmp_path: Path) -> None:
    path = tmp_path / "shard-000000.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in (("p0.chosen.npy", b"x"), ("p0.json", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    manifest = {"shards": [{"file": path.name, "count": 1, "sha256": sha256_file(path)}], "record": "preference-pair"}
    with pytest.raises(FlowpostError, match="lacks its chosen.npy and rejected.npy or json member") as info:
        read_pair_shards(tmp_path, manifest)
    assert info.value.where == str(path)
