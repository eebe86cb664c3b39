"""Source webdataset: local shards by brace pattern or list, fsspec URLs, configurable member keys,
pickles never loaded, each bad kind counted, a held-out split."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import fsspec
import numpy as np
import pytest
from image_samples import png_bytes
from media_samples import npy_bytes, write_shard
from PIL import Image

from flowpost.core.config.schema import WebShardsDataset
from flowpost.data.captioned import captioned_split, source_dependencies
from flowpost.data.sources.registry import source_for
from flowpost.errors import FlowpostError


class _Marker:
    """Unpickling it creates ``path``: a test sees whether anything was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204
        return (Path.touch, (self.path,))


def _config(shards: str | list[str], **fields) -> WebShardsDataset:
    return WebShardsDataset(shards=shards, **{"preprocess": {"resolution": 8}, **fields})


def _samples(start: int, count: int) -> list[dict]:
    return [{"__key__": f"s{i:03d}", "png": png_bytes(i), "txt": f"shade {i}".encode()} for i in range(start, count)]


def test_shards_by_brace_pattern_with_json_metadata_npy_images_and_skipped_pickles(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    first = _samples(0, 2)
    first[0]["json"] = json.dumps({"style": "flat", "score": 3}).encode()
    first[1]["pyd"] = pickle.dumps(_Marker(marker))  # a pickle member: never read
    second = [{"__key__": "arr", "npy": npy_bytes(np.full((6, 4, 3), 200, np.uint8)), "txt": b"an array"}]
    write_shard(tmp_path / "shards" / "train-000.tar", first)
    write_shard(tmp_path / "shards" / "train-001.tar", second)
    split = captioned_split(_config(str(tmp_path / "shards" / "train-{000..001}.tar")), where="datasets.web")
    assert [(r.prompt, r.metadata) for r in split.train] == [
        ("shade 0", {"style": "flat", "score": 3}),
        ("shade 1", {}),
        ("an array", {}),
    ]
    assert split.train[2].image.shape == (3, 8, 8) and np.allclose(split.train[2].image, 200 / 255)
    assert not marker.exists() and split.bad.total == 0


def test_a_list_of_fsspec_urls_and_configured_keys_with_the_caption_in_json(tmp_path: Path) -> None:
    samples = [
        {"__key__": f"k{i}", "image.jpg": _jpeg(), "meta.json": json.dumps({"words": f"j{i}", "n": i}).encode()}
        for i in range(3)
    ]
    local = write_shard(tmp_path / "a.tar", samples[:2])
    with fsspec.open("memory://bucket/b.tar", "wb") as handle:
        handle.write(write_shard(tmp_path / "b.tar", samples[2:]).read_bytes())
    keys = {"image_keys": ["image.jpg"], "caption_keys": ["meta.json"], "caption_column": "words"}
    config = _config([f"file://{local}", "memory://bucket/b.tar"], **keys)
    split = captioned_split(config, where="d")
    assert [(r.prompt, r.metadata) for r in split.train] == [("j0", {"n": 0}), ("j1", {"n": 1}), ("j2", {"n": 2})]
    assert source_dependencies(config, where="d") == [str(local)]  # DVC tracks what it can read

    before = source_for(config).fingerprint(where="d")
    with fsspec.open("memory://bucket/b.tar", "wb") as handle:
        handle.write(write_shard(tmp_path / "c.tar", samples[:1]).read_bytes())
    assert source_for(config).fingerprint(where="d") != before


def _jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (10, 10), (90, 30, 200)).save(buffer, format="JPEG")
    return buffer.getvalue()


def _lab_tiff() -> bytes:
    buffer = io.BytesIO()
    Image.new("LAB", (8, 8)).save(buffer, format="TIFF")
    return buffer.getvalue()


def _shard_with_one_bad_item_of_each_kind(path: Path, marker: Path) -> Path:
    bad = [
        {"__key__": "cut", "png": png_bytes(3)[:40], "txt": b"cut short"},
        {"__key__": "noimage", "txt": b"no image member"},
        {"__key__": "pickled", "npy": npy_bytes(np.array([_Marker(marker)], dtype=object)), "txt": b"an object array"},
        {"__key__": "lab", "tiff": _lab_tiff(), "txt": b"a LAB image"},
        {"__key__": "silent", "png": png_bytes(4)},
        {"__key__": "latin", "png": png_bytes(5), "txt": "caf\xe9".encode("latin-1")},
        {"__key__": "long", "png": png_bytes(6), "txt": b"x" * 81},
    ]
    return write_shard(path, _samples(0, 13) + bad)


def test_each_bad_kind_is_counted_and_past_the_threshold_the_node_fails(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    shard = _shard_with_one_bad_item_of_each_kind(tmp_path / "s.tar", marker)
    keys = {"image_keys": ["png", "npy", "tiff"], "max_caption_chars": 80, "preprocess": {"mode": "grayscale"}}
    split = captioned_split(_config(str(shard), **keys, max_bad_fraction=0.5), where="d")
    counts = {k: n for k, n in split.bad.counts.items() if n}
    assert counts == {
        "unreadable_image": 3,  # truncated, no image member, a pickled array
        "unconvertible_mode": 1,
        "missing_caption": 1,
        "non_utf8_caption": 1,
        "caption_too_long": 1,
    }
    assert len(split.train) == 13 and not marker.exists()
    with pytest.raises(FlowpostError, match=r"7 of 20 items are bad.*first: unreadable_image: .*s.tar: cut") as info:
        captioned_split(_config(str(shard), **keys), where="datasets.web")
    assert info.value.where == "datasets.web.max_bad_fraction"


def test_a_truncated_or_missing_shard_is_named(tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "s.tar", _samples(0, 30))
    shard.write_bytes(shard.read_bytes()[:5000])
    with pytest.raises(FlowpostError, match=r"s.tar is not a readable tar archive after \d+ samples") as info:
        captioned_split(_config(str(shard)), where="datasets.web")
    assert info.value.where == "datasets.web.shards"
    with pytest.raises(FlowpostError, match="gone.tar does not exist"):
        source_for(_config(str(tmp_path / "gone.tar"))).fingerprint(where="d")


def test_held_out_split_and_local_fingerprint(tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "s.tar", _samples(0, 40))
    split = captioned_split(_config(str(shard), split={"eval": 0.25}), where="d")
    assert 0 < len(split.eval) < 40 and not {r.prompt for r in split.eval} & {r.prompt for r in split.train}
    before = source_for(_config(str(shard))).fingerprint(where="d")
    assert source_for(_config(str(shard))).fingerprint(where="d") == before
    write_shard(shard, _samples(1, 40))
    assert source_for(_config(str(shard))).fingerprint(where="d") != before


def test_only_image_text_json_and_npy_members_can_be_keys() -> None:
    with pytest.raises(ValueError, match="pyd: only members ending in png"):
        _config("s.tar", image_keys=["png", "pyd"])
    with pytest.raises(ValueError, match="pickle: only members ending in txt, json"):
        _config("s.tar", caption_keys=["pickle"])
    with pytest.raises(ValueError, match="reads 'shards'"):
        WebShardsDataset()
