"""Webdataset shards of demonstrations plus a manifest with counts and hashes."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from webdataset import TarWriter

from flowpost.core.io import atomic_file, sha256_file
from flowpost.data.records import Demonstration
from flowpost.errors import FlowpostError


def _encode(record: Demonstration) -> dict[str, Any]:
    buffer = io.BytesIO()
    np.save(buffer, record.image, allow_pickle=False)
    meta = {"prompt": record.prompt, "label": record.label, "metadata": record.metadata}
    return {
        "__key__": record.key,
        "npy": buffer.getvalue(),
        "json": json.dumps(meta, sort_keys=True).encode("utf-8"),
    }


def _write_tar(path: Path, samples: list[dict[str, Any]]) -> None:
    with atomic_file(path, "wb") as handle:
        writer = TarWriter(handle, encoder=False, mtime=0.0)
        for sample in samples:
            writer.write(sample)
        writer.close()


def write_shards(
    records: Iterable[Demonstration], out_dir: Path, *, shard_size: int = 2000, name: str = "shard"
) -> dict[str, Any]:
    """Write ``records`` as ``{name}-000000.tar``, ... under ``out_dir`` and return the manifest."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, Any]] = []
    prompts: set[str] = set()
    image_shape: list[int] | None = None
    pending: list[dict[str, Any]] = []

    def flush() -> None:
        path = out_dir / f"{name}-{len(shards):06d}.tar"
        _write_tar(path, pending)
        shards.append({"file": path.name, "count": len(pending), "sha256": sha256_file(path)})
        pending.clear()

    for record in records:
        shape = list(record.image.shape)
        if image_shape is None:
            image_shape = shape
        elif shape != image_shape:
            raise ValueError(f"record {record.key!r} has shape {shape}, expected {image_shape}")
        prompts.add(record.prompt)
        pending.append(_encode(record))
        if len(pending) == shard_size:
            flush()
    if pending:
        flush()
    return {
        "count": sum(shard["count"] for shard in shards),
        "shards": shards,
        "prompts": sorted(prompts),
        "image_shape": image_shape,
    }


def _read_tar(path: Path) -> Iterator[Demonstration]:
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path, "r") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.partition(".")
            handle = tar.extractfile(member)
            assert handle is not None
            samples.setdefault(key, {})[ext] = handle.read()
    for key, parts in samples.items():
        if "npy" not in parts or "json" not in parts:
            raise FlowpostError(
                f"sample {key!r} lacks its npy or json member; re-run acquisition", where=str(path)
            )
        meta = json.loads(parts["json"])
        image = np.load(io.BytesIO(parts["npy"]), allow_pickle=False)
        yield Demonstration(
            key=key,
            prompt=meta["prompt"],
            image=image,
            label=meta["label"],
            metadata=meta["metadata"],
        )


def read_shards(out_dir: Path, manifest: dict[str, Any]) -> list[Demonstration]:
    """Read every record back in write order, after checking each shard's hash."""
    out_dir = Path(out_dir)
    records: list[Demonstration] = []
    for shard in manifest["shards"]:
        path = out_dir / shard["file"]
        if not path.is_file():
            raise FlowpostError("shard is missing; re-run acquisition", where=str(path))
        if sha256_file(path) != shard["sha256"]:
            raise FlowpostError(
                "shard content does not match its manifest hash; re-run acquisition",
                where=str(path),
            )
        records.extend(_read_tar(path))
    return records
