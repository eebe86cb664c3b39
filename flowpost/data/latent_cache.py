"""A dataset's media encoded once by a model family's output codec, as shards beside a manifest.

A latent shard is a shard of demonstrations (or preference pairs) whose arrays are latents instead of
images, in the dataset's record order and under its keys, so a loader over it draws the same batches;
each record's metadata holds the sha256 of the media it encodes (its item hash). The manifest records
the codec fingerprint, the dataset's preprocessing and the sha256 of the dataset manifest that was
encoded; ``read_latent_cache`` checks the last against the dataset the stage reads, and every shard's
hash, before use (the codec fingerprint is checked against the stage's model by the stage).

The codec is deterministic: the families encode to the VAE posterior's mean (``latent_dist.mode()``),
as diffusers training scripts that cache latents do, so a cached latent equals the one encoded per step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flowpost.core.io import read_json, sha256_file, write_json_atomic
from flowpost.data.records import Demonstration, PreferencePair
from flowpost.data.shards import PAIR_ARMS, is_pair_manifest, read_pair_shards, read_shards, write_shards
from flowpost.errors import FlowpostError

MANIFEST = "manifest.json"
SHARD_NAME = "latents"
RERUN = "re-run the latents node"
Encode = Callable[[torch.Tensor], torch.Tensor]  # media in [0, 1] [B, ...] -> latents [B, ...]


def item_hash(array: np.ndarray) -> str:
    """Hex SHA-256 of an item's media: its dtype, shape and bytes."""
    digest = hashlib.sha256(f"{array.dtype.str}{tuple(array.shape)}".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def write_latent_cache(
    train_dir: Path,
    out_dir: Path,
    *,
    encode: Encode,
    codec_fingerprint: str,
    preprocess: dict[str, Any],
    device: torch.device,
    batch_size: int = 32,
    where: str = "latents",
) -> dict[str, Any]:
    """Encode every record of the dataset shards in ``train_dir`` into ``out_dir``; return the manifest.

    Latents must be [C, H, W] or [C, T, H, W] (families that pack their latents into tokens are refused
    naming ``where``)."""
    dataset_manifest = Path(train_dir) / MANIFEST
    manifest = read_json(dataset_manifest, what="dataset manifest")
    pairs = is_pair_manifest(manifest)
    records = read_pair_shards(train_dir, manifest) if pairs else read_shards(train_dir, manifest)
    arms = PAIR_ARMS if pairs else ("image",)
    encoded = list(_encoded(records, arms, encode, device, batch_size, where=where))
    summary = {
        **write_shards(encoded, Path(out_dir), name=SHARD_NAME),
        "codec_fingerprint": codec_fingerprint,
        "preprocess": preprocess,
        "dataset_manifest_sha256": sha256_file(dataset_manifest),
        "item_hashes": [record.metadata["item_hash"] for record in encoded],
    }
    write_json_atomic(Path(out_dir) / MANIFEST, summary)
    return summary


def _encoded(
    records: list[Any], arms: tuple[str, ...], encode: Encode, device: torch.device, batch_size: int, *, where: str
) -> Iterator[Demonstration | PreferencePair]:
    """The records with each arm's media replaced by its latent (fp32, CPU) and its item hash recorded."""
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        latents = {}
        for arm in arms:
            media = torch.from_numpy(np.stack([getattr(r, arm) for r in chunk])).to(device, torch.float32)
            with torch.no_grad():
                latents[arm] = encode(media).to("cpu", torch.float32).numpy()
            if latents[arm].ndim not in (4, 5):
                raise FlowpostError(
                    f"the codec gives latents of shape {tuple(latents[arm].shape[1:])} per item; a latent cache "
                    "holds [C, H, W] or [C, T, H, W] latents (families that pack latents into tokens encode per step)",
                    where=where,
                )
        for row, record in enumerate(chunk):
            hashes = "".join(item_hash(getattr(record, arm)) for arm in arms)
            meta = {**record.metadata, "item_hash": hashlib.sha256(hashes.encode()).hexdigest()}
            yield replace(record, metadata=meta, **{arm: latents[arm][row] for arm in arms})


def latent_cache_manifest(latents_dir: Path) -> dict[str, Any]:
    """The manifest of a latent cache, which must name the codec that filled it."""
    manifest = read_json(Path(latents_dir) / MANIFEST, what="latent cache manifest")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("codec_fingerprint"), str):
        raise FlowpostError(f"latent cache manifest records no codec fingerprint; {RERUN}", where=str(latents_dir))
    return manifest


def read_latent_cache(latents_dir: Path, train_dir: Path) -> tuple[dict[str, Any], list[Any]]:
    """The manifest and the latent records of ``latents_dir``, after checking that it encodes the dataset
    in ``train_dir`` (its manifest's sha256) and that every shard is intact."""
    latents_dir = Path(latents_dir)
    manifest = latent_cache_manifest(latents_dir)
    dataset_manifest = Path(train_dir) / MANIFEST
    if manifest.get("dataset_manifest_sha256") != sha256_file(dataset_manifest):
        raise FlowpostError(
            f"the latent cache encodes another version of the dataset than {dataset_manifest}; {RERUN} "
            "(or point data.latents at a cache of this dataset)",
            where=str(latents_dir),
        )
    pairs = is_pair_manifest(manifest)
    return manifest, read_pair_shards(latents_dir, manifest) if pairs else read_shards(latents_dir, manifest)
