"""Webdataset shards of demonstrations or preference pairs plus a manifest with counts and hashes.

A demonstration is ``KEY.npy`` (its image) and ``KEY.json``; a preference pair is ``KEY.chosen.npy``,
``KEY.rejected.npy`` and ``KEY.json``, and its shards' manifest says ``"record": "preference-pair"``.
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from webdataset import TarWriter

from flowpost.core.io import atomic_file, sha256_file
from flowpost.data.records import Demonstration, PreferencePair
from flowpost.errors import FlowpostError

RERUN = "re-run acquisition"
PAIR_ARMS = ("chosen", "rejected")
PAIR_RECORD = "preference-pair"  # the manifest's "record" for shards of preference pairs
Record = Demonstration | PreferencePair
SHARD_SIZE = 2000  # records per shard unless a writer is told otherwise


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _encode(record: Record) -> dict[str, Any]:
    meta = {"prompt": record.prompt, "label": record.label, "metadata": record.metadata}
    arrays = (
        {f"{arm}.npy": _npy(getattr(record, arm)) for arm in PAIR_ARMS}
        if isinstance(record, PreferencePair)
        else {"npy": _npy(record.image)}
    )
    return {"__key__": record.key, **arrays, "json": json.dumps(meta, sort_keys=True).encode("utf-8")}


def is_pair_manifest(manifest: Any) -> bool:
    """Whether a shard manifest lists preference pairs (else demonstrations)."""
    return isinstance(manifest, dict) and manifest.get("record") == PAIR_RECORD


def _write_tar(path: Path, samples: list[dict[str, Any]]) -> None:
    with atomic_file(path, "wb") as handle:
        writer = TarWriter(handle, encoder=False, mtime=0.0)
        try:
            for sample in samples:
                writer.write(sample)
        except BaseException:
            with contextlib.suppress(OSError):  # closed now: not flushed later, when collected, into a closed file
                writer.close()
            raise
        writer.close()


class ShardWriter:
    """Records (all demonstrations or all preference pairs) added one at a time, written as
    ``{name}-000000.tar``, ... under ``out_dir`` every ``shard_size``: at most one shard is held in memory."""

    def __init__(self, out_dir: Path, *, shard_size: int = SHARD_SIZE, name: str = "shard") -> None:
        if shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        self.out_dir, self.shard_size, self.name = Path(out_dir), shard_size, name
        self.shards: list[dict[str, Any]] = []
        self.labels: dict[str, Any] = {}
        self.image_shape: list[int] | None = None
        self.kinds: set[type] = set()
        self.pending: list[dict[str, Any]] = []

    @property
    def count(self) -> int:
        """The records added so far."""
        return sum(shard["count"] for shard in self.shards) + len(self.pending)

    def add(self, record: Record) -> None:
        self.kinds.add(type(record))
        if len(self.kinds) > 1:
            raise ValueError(f"record {record.key!r}: one shard set holds demonstrations or pairs, not both")
        shape = list((record.chosen if isinstance(record, PreferencePair) else record.image).shape)
        if self.image_shape is None:
            self.image_shape = shape
        elif shape != self.image_shape:
            raise ValueError(f"record {record.key!r} has shape {shape}, expected {self.image_shape}")
        self.labels.setdefault(record.prompt, record.label)
        self.pending.append(_encode(record))
        if len(self.pending) == self.shard_size:
            self._flush()

    def _flush(self) -> None:
        path = self.out_dir / f"{self.name}-{len(self.shards):06d}.tar"
        _write_tar(path, self.pending)
        self.shards.append({"file": path.name, "count": len(self.pending), "sha256": sha256_file(path)})
        self.pending.clear()

    def close(self) -> dict[str, Any]:
        """Write the last, partly filled shard and return the manifest."""
        if self.pending:
            self._flush()
        prompts = sorted(self.labels)
        return {
            "count": self.count,
            "shards": self.shards,
            "prompts": prompts,
            "labels": {prompt: self.labels[prompt] for prompt in prompts},  # the prompt pool, without the images
            "image_shape": self.image_shape,
            **({"record": PAIR_RECORD} if PreferencePair in self.kinds else {}),
        }


def write_shards(
    records: Iterable[Record], out_dir: Path, *, shard_size: int = SHARD_SIZE, name: str = "shard"
) -> dict[str, Any]:
    """Write ``records`` (all demonstrations or all preference pairs) as ``{name}-000000.tar``, ...
    under ``out_dir`` and return the manifest."""
    writer = ShardWriter(out_dir, shard_size=shard_size, name=name)
    writer.out_dir.mkdir(parents=True, exist_ok=True)
    for record in records:
        writer.add(record)
    return writer.close()


def _read_tar(path: Path) -> Iterator[Record]:
    samples: dict[str, dict[str, bytes]] = {}
    try:
        with tarfile.open(path, "r") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key, _, ext = member.name.partition(".")
                handle = tar.extractfile(member)
                assert handle is not None
                samples.setdefault(key, {})[ext] = handle.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise FlowpostError(f"shard is not a readable tar archive ({exc}); {RERUN}", where=str(path)) from None
    for key, parts in samples.items():
        pair_members = tuple(f"{arm}.npy" for arm in PAIR_ARMS)
        arrays = pair_members if any(member in parts for member in pair_members) else ("npy",)
        if any(member not in parts for member in (*arrays, "json")):
            members = " and ".join(arrays)
            raise FlowpostError(f"sample {key!r} lacks its {members} or json member; {RERUN}", where=str(path))
        yield _decode(key, parts, path)


def _decode(key: str, parts: dict[str, bytes], path: Path) -> Record:
    """One sample from its members; a malformed member raises naming the shard and the sample."""
    try:
        meta = json.loads(parts["json"])
        if not isinstance(meta, dict):
            raise ValueError("metadata is not a JSON object")
        fields = {"key": key, "prompt": meta["prompt"], "label": meta["label"], "metadata": meta["metadata"]}
        if "npy" not in parts:
            chosen, rejected = (np.load(io.BytesIO(parts[f"{arm}.npy"]), allow_pickle=False) for arm in PAIR_ARMS)
            return PreferencePair(chosen=chosen, rejected=rejected, **fields)
        return Demonstration(image=np.load(io.BytesIO(parts["npy"]), allow_pickle=False), **fields)
    except (ValueError, KeyError, TypeError, OSError, EOFError) as exc:  # JSONDecodeError is a ValueError
        raise FlowpostError(
            f"sample {key!r} is malformed ({type(exc).__name__}: {exc}); {RERUN}", where=str(path)
        ) from None


def _manifest_shards(out_dir: Path, manifest: Any) -> list[tuple[str, str]]:
    """(file, sha256) of each shard a manifest lists; a malformed manifest raises naming it."""
    where = str(out_dir / "manifest.json")
    shards = manifest.get("shards") if isinstance(manifest, dict) else None
    if not isinstance(shards, list):
        raise FlowpostError(f"shard manifest lists no shards; {RERUN}", where=where)
    entries = []
    for i, shard in enumerate(shards):
        file = shard.get("file") if isinstance(shard, dict) else None
        digest = shard.get("sha256") if isinstance(shard, dict) else None
        if not (isinstance(file, str) and file and Path(file).name == file and isinstance(digest, str)):
            raise FlowpostError(f"shard manifest entry {i} needs a file name and a sha256; {RERUN}", where=where)
        entries.append((file, digest))
    return entries


def read_shards(out_dir: Path, manifest: dict[str, Any]) -> list[Demonstration]:
    """Read every demonstration back in write order, after checking each shard's hash."""
    return _read_records(out_dir, manifest, Demonstration)


def read_pair_shards(out_dir: Path, manifest: dict[str, Any]) -> list[PreferencePair]:
    """Read every preference pair back in write order, after checking each shard's hash."""
    return _read_records(out_dir, manifest, PreferencePair)


def _read_records(out_dir: Path, manifest: dict[str, Any], kind: type[Any]) -> list[Any]:
    """The records of ``kind`` the shards hold; shards of the other kind raise naming the folder."""
    out_dir = Path(out_dir)
    records: list[Any] = []
    for file, digest in _manifest_shards(out_dir, manifest):
        path = out_dir / file
        if not path.is_file():
            raise FlowpostError(f"shard is missing; {RERUN}", where=str(path))
        if sha256_file(path) != digest:
            raise FlowpostError(f"shard content does not match its manifest hash; {RERUN}", where=str(path))
        for record in _read_tar(path):
            if not isinstance(record, kind):
                wanted = "preference pairs" if kind is PreferencePair else "demonstrations"
                raise FlowpostError(
                    f"sample {record.key!r} is not one of the {wanted} this reader expects; point the stage at a "
                    "dataset of that kind",
                    where=str(path),
                )
            records.append(record)
    return records
