from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from flowpost.core.conditions import ConditionBatch
from flowpost.core.io import sha256_file
from flowpost.data.condition_cache import (
    load_condition_table,
    load_conditions,
    prompt_hash,
    update_condition_cache,
)
from flowpost.errors import FlowpostError

SEQ, HIDDEN, POOLED = 5, 4, 3


def fake_row(prompt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "little")
    gen = torch.Generator().manual_seed(seed)
    length = 1 + seed % SEQ
    mask = (torch.arange(SEQ) < length).to(torch.long)
    return torch.randn(SEQ, HIDDEN, generator=gen), mask, torch.randn(POOLED, generator=gen)


class CountingEncoder:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self.calls = 0

    def __call__(self, prompts: list[str]) -> ConditionBatch:
        self.calls += 1
        self.seen.extend(prompts)
        rows = [fake_row(p) for p in prompts]
        return ConditionBatch(
            token_states=torch.stack([r[0] for r in rows]),
            token_mask=torch.stack([r[1] for r in rows]),
            pooled=torch.stack([r[2] for r in rows]),
        )


PROMPTS = ["a", "b", "a", "c", "d", "b", "e"]


def test_first_call_misses_then_pure_hit(tmp_path: Path) -> None:
    enc = CountingEncoder()
    stats = update_condition_cache(tmp_path, PROMPTS, encoder_fingerprint="f1", encode=enc, batch_size=2)
    assert (stats.hits, stats.misses, stats.total) == (0, 5, 5)
    assert enc.seen == ["a", "b", "c", "d", "e"] and enc.calls == 3

    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["encoder_fingerprint"] == "f1" and manifest["count"] == 5
    assert manifest["prompt_hashes"] == sorted(prompt_hash(p) for p in "abcde")
    assert manifest["sha256"] == sha256_file(tmp_path / "conditions.parquet")

    again = CountingEncoder()
    stats = update_condition_cache(tmp_path, PROMPTS, encoder_fingerprint="f1", encode=again)
    assert (stats.hits, stats.misses) == (5, 0) and again.calls == 0
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest


def test_new_prompt_and_new_fingerprint(tmp_path: Path) -> None:
    update_condition_cache(tmp_path, PROMPTS, encoder_fingerprint="f1", encode=CountingEncoder())
    enc = CountingEncoder()
    stats = update_condition_cache(tmp_path, [*PROMPTS, "z"], encoder_fingerprint="f1", encode=enc)
    assert (stats.hits, stats.misses) == (5, 1) and enc.seen == ["z"]

    other = CountingEncoder()
    stats = update_condition_cache(tmp_path, ["a", "b"], encoder_fingerprint="f2", encode=other)
    assert (stats.hits, stats.misses) == (0, 2) and other.seen == ["a", "b"]
    assert load_condition_table(tmp_path, "f2")[0] == ["a", "b"]
    assert len(load_condition_table(tmp_path, "f1")[0]) == 6


def test_load_round_trip_is_bit_identical_and_ordered(tmp_path: Path) -> None:
    update_condition_cache(tmp_path, PROMPTS, encoder_fingerprint="f1", encode=CountingEncoder(), batch_size=3)
    wanted = ["e", "a", "e", "c"]
    batch = load_conditions(tmp_path, wanted, encoder_fingerprint="f1")
    expected = CountingEncoder()(wanted)
    assert batch.token_states.dtype == torch.float32 and batch.pooled.dtype == torch.float32
    assert torch.equal(batch.token_states, expected.token_states)
    assert torch.equal(batch.token_mask, expected.token_mask)
    assert torch.equal(batch.pooled, expected.pooled)


def test_missing_prompt_or_cache_is_reported(tmp_path: Path) -> None:
    with pytest.raises(FlowpostError, match="conditions node"):
        load_conditions(tmp_path, ["a"], encoder_fingerprint="f1")
    update_condition_cache(tmp_path, ["a"], encoder_fingerprint="f1", encode=CountingEncoder())
    with pytest.raises(FlowpostError, match="'nope'.*re-run the conditions node") as info:
        load_conditions(tmp_path, ["a", "nope"], encoder_fingerprint="f1")
    assert info.value.where == str(tmp_path)
    with pytest.raises(FlowpostError, match="fingerprint"):
        load_conditions(tmp_path, ["a"], encoder_fingerprint="f2")


def test_a_failed_table_write_keeps_the_previous_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flowpost.data.condition_cache as cache

    update_condition_cache(tmp_path, ["a", "b"], encoder_fingerprint="f1", encode=CountingEncoder())
    before = (tmp_path / "conditions.parquet").read_bytes()
    real_write = cache.pq.write_table

    def half_write(table, where, **kwargs):  # noqa: ANN001, ANN003, ANN202
        real_write(table.slice(0, 1), where, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(cache.pq, "write_table", half_write)
    with pytest.raises(OSError, match="disk full"):
        update_condition_cache(tmp_path, ["c"], encoder_fingerprint="f1", encode=CountingEncoder())
    assert (tmp_path / "conditions.parquet").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conditions.parquet", "manifest.json"]
    assert load_condition_table(tmp_path, "f1")[0] == ["a", "b"]


def test_rows_without_pooled_vectors_and_of_different_lengths_round_trip(tmp_path: Path) -> None:
    """A family with no pooled vector (qwen-image) stores zero-width ones; each encode call pads to its own longest."""

    def encode(prompts: list[str]) -> ConditionBatch:
        length = 2 + len(prompts)
        states = torch.stack([fake_row(p)[0][:1].expand(length, HIDDEN) for p in prompts])
        mask = torch.ones(len(prompts), length, dtype=torch.int8)
        mask[0, -1] = 0  # the first prompt of each call is padded by one position
        return ConditionBatch(states, mask, torch.zeros(len(prompts), 0))

    update_condition_cache(tmp_path, ["a"], encoder_fingerprint="f", encode=encode)
    update_condition_cache(tmp_path, ["b", "c", "d"], encoder_fingerprint="f", encode=encode)
    batch = load_conditions(tmp_path, ["d", "a", "b"], encoder_fingerprint="f")
    assert batch.pooled.shape == (3, 0) and batch.token_states.shape == (3, 5, HIDDEN)
    assert batch.token_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]
    for row, prompt in enumerate(["d", "a", "b"]):
        real = int(batch.token_mask[row].sum())
        assert torch.equal(batch.token_states[row, :real], fake_row(prompt)[0][:1].expand(real, HIDDEN))
    assert not batch.token_states[1, 3:].any()  # "a" was stored 3 long: the loader pads it with zeros
