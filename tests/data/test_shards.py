from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowpost.core.io import sha256_file
from flowpost.data.records import Demonstration
from flowpost.data.shards import read_shards, write_shards
from flowpost.errors import FlowpostError
from flowpost_digits.data import TRAIN_TEMPLATES, demonstrations, load_digits_split


@pytest.fixture(scope="module")
def records() -> list[Demonstration]:
    split = load_digits_split(image_size=16)
    return demonstrations(split.train_images[:25], split.train_labels[:25], TRAIN_TEMPLATES, prefix="train")


def test_round_trip_is_bit_identical(records: list[Demonstration], tmp_path: Path) -> None:
    manifest = write_shards(records, tmp_path, shard_size=40, name="train")
    assert manifest["count"] == 100
    assert [s["count"] for s in manifest["shards"]] == [40, 40, 20]
    assert [s["file"] for s in manifest["shards"]][0] == "train-000000.tar"
    for shard in manifest["shards"]:
        assert shard["sha256"] == sha256_file(tmp_path / shard["file"])
    assert manifest["prompts"] == sorted({r.prompt for r in records})
    assert manifest["image_shape"] == [1, 16, 16]
    assert not list(tmp_path.glob(".*"))

    back = read_shards(tmp_path, manifest)
    assert [r.key for r in back] == [r.key for r in records]
    assert [r.prompt for r in back] == [r.prompt for r in records]
    assert [r.label for r in back] == [r.label for r in records]
    assert [r.metadata for r in back] == [r.metadata for r in records]
    for got, want in zip(back, records, strict=True):
        assert got.image.dtype == np.float32
        assert got.image.tobytes() == want.image.tobytes()


def test_shards_are_reproducible(records: list[Demonstration], tmp_path: Path) -> None:
    a = write_shards(records[:10], tmp_path / "a")
    b = write_shards(records[:10], tmp_path / "b")
    assert a == b


def test_corrupted_or_missing_shard_is_reported(records: list[Demonstration], tmp_path: Path) -> None:
    manifest = write_shards(records[:20], tmp_path, shard_size=10)
    second = tmp_path / manifest["shards"][1]["file"]
    data = bytearray(second.read_bytes())
    data[600] ^= 0xFF
    second.write_bytes(bytes(data))
    with pytest.raises(FlowpostError, match="re-run acquisition") as info:
        read_shards(tmp_path, manifest)
    assert info.value.where == str(second)
    second.unlink()
    with pytest.raises(FlowpostError, match="missing"):
        read_shards(tmp_path, manifest)


def _rewrite(path: Path, samples: list[dict], manifest: dict) -> None:
    """Replace a shard's content and its manifest hash, as a faulty writer would."""
    from flowpost.data.shards import _write_tar

    _write_tar(path, samples)
    for shard in manifest["shards"]:
        if shard["file"] == path.name:
            shard["sha256"] = sha256_file(path)


@pytest.mark.parametrize(
    "sample",
    [
        {"__key__": "k", "npy": b"not an npy", "json": b'{"prompt": "p", "label": 1, "metadata": {}}'},
        {"__key__": "k", "npy": None, "json": b"{not json"},
        {"__key__": "k", "npy": None, "json": b'{"prompt": "p"}'},
        {"__key__": "k", "npy": None, "json": b"[1, 2]"},
    ],
)
def test_a_malformed_member_names_the_shard(records: list[Demonstration], tmp_path: Path, sample: dict) -> None:
    import io as stdio

    manifest = write_shards(records[:3], tmp_path)
    path = tmp_path / manifest["shards"][0]["file"]
    if sample["npy"] is None:
        buffer = stdio.BytesIO()
        np.save(buffer, records[0].image, allow_pickle=False)
        sample = {**sample, "npy": buffer.getvalue()}
    _rewrite(path, [sample], manifest)
    with pytest.raises(FlowpostError, match="'k' is malformed") as info:
        read_shards(tmp_path, manifest)
    assert info.value.where == str(path)


def test_a_shard_that_is_not_a_tar_names_the_shard(records: list[Demonstration], tmp_path: Path) -> None:
    manifest = write_shards(records[:3], tmp_path)
    path = tmp_path / manifest["shards"][0]["file"]
    path.write_bytes(b"\x00garbage" * 7)
    manifest["shards"][0]["sha256"] = sha256_file(path)
    with pytest.raises(FlowpostError, match="not a readable tar") as info:
        read_shards(tmp_path, manifest)
    assert info.value.where == str(path)


@pytest.mark.parametrize(
    "manifest",
    [[], {}, {"shards": "x"}, {"shards": [{"file": "a.tar"}]}, {"shards": [{"file": "../a.tar", "sha256": "0"}]}],
)
def test_a_malformed_manifest_names_the_manifest(tmp_path: Path, manifest) -> None:  # noqa: ANN001
    with pytest.raises(FlowpostError, match="manifest") as info:
        read_shards(tmp_path, manifest)
    assert info.value.where == str(tmp_path / "manifest.json")
