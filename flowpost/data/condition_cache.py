"""Parquet cache of encoded prompts keyed by (prompt hash, encoder fingerprint)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from flowpost.core.conditions import ConditionBatch
from flowpost.core.io import atomic_file, hash_mismatch, read_json, sha256_file, write_json_atomic
from flowpost.core.trainers.inputs import ConditionTable
from flowpost.errors import FlowpostError

TABLE = "conditions.parquet"
MANIFEST = "manifest.json"

SCHEMA = pa.schema(
    [
        ("prompt_hash", pa.string()),
        ("encoder_fingerprint", pa.string()),
        ("prompt", pa.string()),
        ("token_states", pa.list_(pa.float32())),
        ("token_mask", pa.list_(pa.int8())),
        ("pooled", pa.list_(pa.float32())),
        ("seq_len", pa.int32()),
        ("hidden_dim", pa.int32()),
    ]
)


@dataclass(frozen=True)
class CacheStats:
    """How many unique prompts were already cached (hits) and how many were encoded (misses)."""

    hits: int
    misses: int
    total: int


def prompt_hash(prompt: str) -> str:
    """Hex SHA-256 of the prompt's UTF-8 bytes."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def _read_table(cache_dir: Path) -> pa.Table:
    path = cache_dir / TABLE
    if not path.is_file():
        return SCHEMA.empty_table()
    return pq.read_table(path, schema=SCHEMA)


def _write_table(path: Path, table: pa.Table) -> None:
    with atomic_file(path, "wb") as handle:
        pq.write_table(table, handle)


def _rows(prompts: list[str], fingerprint: str, batch: ConditionBatch) -> pa.Table:
    states = batch.token_states.detach().to("cpu", torch.float32).contiguous()
    mask = batch.token_mask.detach().to("cpu", torch.int8).contiguous()
    pooled = batch.pooled.detach().to("cpu", torch.float32).contiguous()
    if not (len(states) == len(mask) == len(pooled) == len(prompts)):
        raise ValueError(f"encoder returned {len(states)} rows for {len(prompts)} prompts")
    n, seq_len, hidden = states.shape
    return pa.table(
        {
            "prompt_hash": [prompt_hash(p) for p in prompts],
            "encoder_fingerprint": [fingerprint] * n,
            "prompt": prompts,
            "token_states": _list_column(states.numpy(), pa.float32()),
            "token_mask": _list_column(mask.numpy(), pa.int8()),
            "pooled": _list_column(pooled.numpy(), pa.float32()),
            "seq_len": pa.array([seq_len] * n, pa.int32()),
            "hidden_dim": pa.array([hidden] * n, pa.int32()),
        },
        schema=SCHEMA,
    )


def _list_column(rows: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    """One list per row of ``rows`` (each row flattened); rows may be empty (a family without pooled vectors)."""
    n = len(rows)
    width = int(np.prod(rows.shape[1:]))
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width)
    return pa.ListArray.from_arrays(offsets, pa.array(rows.reshape(-1), value_type))


def update_condition_cache(
    cache_dir: Path,
    prompts: Iterable[str],
    *,
    encoder_fingerprint: str,
    encode: Callable[[list[str]], ConditionBatch],
    batch_size: int = 64,
) -> CacheStats:
    """Encode the prompts not yet cached for ``encoder_fingerprint``, each once, and append them."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    table = _read_table(cache_dir)
    cached = {
        h
        for h, f in zip(
            table.column("prompt_hash").to_pylist(),
            table.column("encoder_fingerprint").to_pylist(),
            strict=True,
        )
        if f == encoder_fingerprint
    }
    unique = list(dict.fromkeys(prompts))
    missing = [p for p in unique if prompt_hash(p) not in cached]
    parts = [table]
    for start in range(0, len(missing), batch_size):
        chunk = missing[start : start + batch_size]
        parts.append(_rows(chunk, encoder_fingerprint, encode(chunk)))
    table = pa.concat_tables(parts)
    path = cache_dir / TABLE
    if missing or not path.is_file():
        _write_table(path, table)
    own = pc.equal(table.column("encoder_fingerprint"), encoder_fingerprint)
    hashes = sorted(table.filter(own).column("prompt_hash").to_pylist())
    write_json_atomic(
        cache_dir / MANIFEST,
        {
            "encoder_fingerprint": encoder_fingerprint,
            "count": len(hashes),
            "prompt_hashes": hashes,
            "sha256": sha256_file(path),
        },
    )
    return CacheStats(hits=len(unique) - len(missing), misses=len(missing), total=len(unique))


def _to_batch(table: pa.Table, where: Path) -> ConditionBatch:
    """Rows as float32 tensors; shorter sequences are zero-padded with mask 0 to the longest."""
    hidden_dims = set(table.column("hidden_dim").to_pylist())
    pooled_dims = set(pc.list_value_length(table.column("pooled")).to_pylist())
    if len(hidden_dims) != 1 or len(pooled_dims) != 1:
        raise FlowpostError(
            "cached rows have mixed hidden sizes; delete the cache and re-run the conditions node",
            where=str(where),
        )
    (hidden,), (pooled_dim,) = hidden_dims, pooled_dims
    seq_lens = table.column("seq_len").to_pylist()
    n, longest = table.num_rows, max(seq_lens)
    states_flat = _flat(table, "token_states", np.float32)
    mask_flat = _flat(table, "token_mask", np.int8)
    states = np.zeros((n, longest, hidden), dtype=np.float32)
    mask = np.zeros((n, longest), dtype=np.int64)
    offset = 0
    for i, seq_len in enumerate(seq_lens):
        states[i, :seq_len] = states_flat[offset * hidden : (offset + seq_len) * hidden].reshape(seq_len, hidden)
        mask[i, :seq_len] = mask_flat[offset : offset + seq_len]
        offset += seq_len
    pooled = _flat(table, "pooled", np.float32).reshape(n, pooled_dim).copy()
    return ConditionBatch(
        token_states=torch.from_numpy(states),
        token_mask=torch.from_numpy(mask),
        pooled=torch.from_numpy(pooled),
    )


def _flat(table: pa.Table, name: str, dtype: type) -> np.ndarray:
    values = table.column(name).combine_chunks().flatten()
    return values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _check_table(cache_dir: Path) -> None:
    """Refuse a table whose bytes differ from the sha256 its manifest recorded when it was written."""
    manifest = read_json(cache_dir / MANIFEST, what="condition cache manifest")
    recorded = manifest.get("sha256") if isinstance(manifest, dict) else None
    problem = hash_mismatch(cache_dir, {TABLE: recorded}) if isinstance(recorded, str) else "no sha256 recorded"
    if problem is not None:
        raise FlowpostError(
            f"condition cache is damaged ({problem} in {MANIFEST}); re-run the conditions node", where=str(cache_dir)
        )


def load_condition_table(cache_dir: Path, encoder_fingerprint: str) -> tuple[list[str], ConditionBatch]:
    """All prompts cached for ``encoder_fingerprint`` and their conditions, row-aligned."""
    cache_dir = Path(cache_dir)
    if not (cache_dir / TABLE).is_file():
        raise FlowpostError("condition cache not found; re-run the conditions node", where=str(cache_dir))
    _check_table(cache_dir)
    table = _read_table(cache_dir)
    table = table.filter(pc.equal(table.column("encoder_fingerprint"), encoder_fingerprint))
    if table.num_rows == 0:
        raise FlowpostError(
            f"no conditions cached for encoder fingerprint {encoder_fingerprint!r}; re-run the conditions node",
            where=str(cache_dir),
        )
    return table.column("prompt").to_pylist(), _to_batch(table, cache_dir)


def load_conditions(cache_dir: Path, prompts: list[str], *, encoder_fingerprint: str) -> ConditionBatch:
    """Conditions for ``prompts`` in the given order (duplicates allowed); mask is int64."""
    cached, batch = load_condition_table(cache_dir, encoder_fingerprint)
    return ConditionTable(prompts=cached, batch=batch, where=str(cache_dir)).lookup(prompts)
