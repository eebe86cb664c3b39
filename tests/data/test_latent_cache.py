"""The latent cache: records in the dataset's order with their item hashes, checked shards, refused shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flowpost.core.io import write_json_atomic
from flowpost.data.latent_cache import item_hash, read_latent_cache, write_latent_cache
from flowpost.data.records import PreferencePair
from flowpost.data.shards import write_shards
from flowpost.errors import FlowpostError


def _pairs(root: Path, count: int = 7) -> Path:
    rng = np.random.default_rng(0)
    records = [
        PreferencePair(
            key=f"p{i}",
            prompt=f"prompt {i % 3}",
            chosen=rng.random((3, 4, 4), dtype=np.float32),
            rejected=rng.random((3, 4, 4), dtype=np.float32),
        )
        for i in range(count)
    ]
    train = root / "data" / "train"
    write_json_atomic(train / "manifest.json", write_shards(records, train, shard_size=3))
    return train


def _halved(media: torch.Tensor) -> torch.Tensor:
    """A deterministic codec that halves the resolution (average pooling) and maps to [-1, 1]."""
    return torch.nn.functional.avg_pool2d(media * 2.0 - 1.0, 2)


def _write(train: Path, out: Path, encode=_halved) -> dict:  # noqa: ANN001
    options = {"codec_fingerprint": "halved", "preprocess": {"resolution": 4}, "device": torch.device("cpu")}
    return write_latent_cache(train, out, encode=encode, batch_size=2, where="latents.pairs.model.family", **options)


def test_pairs_are_encoded_in_order_under_their_keys_with_the_hash_of_both_arms(tmp_path: Path) -> None:
    train = _pairs(tmp_path)
    manifest = _write(train, tmp_path / "latents")
    assert manifest["record"] == "preference-pair" and manifest["image_shape"] == [3, 2, 2]
    read_manifest, latents = read_latent_cache(tmp_path / "latents", train)
    assert read_manifest == manifest and [r.key for r in latents] == [f"p{i}" for i in range(7)]
    rng = np.random.default_rng(0)
    for record in latents:
        chosen, rejected = rng.random((3, 4, 4), dtype=np.float32), rng.random((3, 4, 4), dtype=np.float32)
        for arm, media in (("chosen", chosen), ("rejected", rejected)):
            expected = _halved(torch.from_numpy(media)[None])[0].numpy()
            np.testing.assert_array_equal(getattr(record, arm), expected)
        assert record.metadata["item_hash"] != item_hash(chosen)  # both arms, not one
    assert len(set(manifest["item_hashes"])) == 7


def test_a_changed_shard_is_refused_naming_it(tmp_path: Path) -> None:
    train = _pairs(tmp_path)
    _write(train, tmp_path / "latents")
    shard = tmp_path / "latents" / "latents-000000.tar"
    shard.write_bytes(shard.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(FlowpostError, match="does not match its manifest hash") as raised:
        read_latent_cache(tmp_path / "latents", train)
    assert raised.value.where == str(shard)


def test_latents_packed_into_tokens_are_refused_naming_the_family(tmp_path: Path) -> None:
    def packed(media: torch.Tensor) -> torch.Tensor:
        return media.flatten(2).transpose(1, 2)  # [B, tokens, C]

    with pytest.raises(FlowpostError, match="packs|pack latents") as raised:
        _write(_pairs(tmp_path), tmp_path / "latents", encode=packed)
    assert raised.value.where == "latents.pairs.model.family"
