from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import flowpost.core.checkpoint as checkpoint
import flowpost.core.io as io
from flowpost.core.checkpoint import (
    LATEST,
    MANIFEST,
    TrainingState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from flowpost.errors import FlowpostError


class Payload:
    """An arbitrary picklable object that a weights-only load must refuse."""


def _model() -> torch.nn.Module:
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
    return model


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(16, 4, generator=gen)
    target = torch.randn(16, 2, generator=gen)
    optimizer.zero_grad()
    loss = (model(inputs) - target).pow(2).mean()
    loss.backward()
    optimizer.step()


def _state(step: int, model: torch.nn.Module | None = None, optimizer: Any = None) -> TrainingState:
    model = model or _model()
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    return TrainingState(
        step=step,
        model={k: v.detach().clone() for k, v in model.state_dict().items()},
        optimizer=optimizer.state_dict(),
        scheduler=scheduler.state_dict(),
        snapshots={
            "ema": {k: v.detach().clone() * 0.5 for k, v in model.state_dict().items()},
            "ref": {"w": torch.arange(6, dtype=torch.float64).reshape(2, 3)},
        },
        rng={"torch": torch.get_rng_state()},
        trainer={
            "progress": {"optimizer_step": step, "data_epoch": 1},
            "callbacks": {"ema": {"n": 3}},
        },
    )


def test_round_trip_is_bit_identical(tmp_path: Path) -> None:
    state = _state(7)
    path = save_checkpoint(tmp_path, state)
    assert path == tmp_path / "step-7"
    loaded = load_checkpoint(path)
    assert loaded.step == 7
    assert loaded.trainer == state.trainer
    assert loaded.scheduler == state.scheduler
    assert set(loaded.model) == set(state.model)
    for key, value in state.model.items():
        assert loaded.model[key].dtype == value.dtype
        assert torch.equal(loaded.model[key], value)
    assert set(loaded.snapshots) == {"ema", "ref"}
    for name, tensors in state.snapshots.items():
        for key, value in tensors.items():
            assert loaded.snapshots[name][key].dtype == value.dtype
            assert torch.equal(loaded.snapshots[name][key], value)
    assert torch.equal(loaded.rng["torch"], state.rng["torch"])


def test_optimizer_state_resumes_exactly(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    _train_step(model, optimizer, seed=1)
    path = save_checkpoint(tmp_path, _state(1, model, optimizer))

    # continue the original for one more step
    _train_step(model, optimizer, seed=2)
    expected = {k: v.clone() for k, v in model.state_dict().items()}

    # a fresh model and optimizer restored from disk take the same step
    loaded = load_checkpoint(path)
    fresh = _model()
    with torch.no_grad():
        for param in fresh.parameters():
            param.add_(1.0)  # make sure the weights really come from the checkpoint
    fresh.load_state_dict(loaded.model)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2, weight_decay=0.1)
    fresh_optimizer.load_state_dict(loaded.optimizer)
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 1
    _train_step(fresh, fresh_optimizer, seed=2)
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, expected[key]), key


def test_rng_state_restores_the_stream(tmp_path: Path) -> None:
    torch.manual_seed(5)
    path = save_checkpoint(tmp_path, _state(1))
    after = torch.randn(4)
    torch.manual_seed(99)
    torch.set_rng_state(load_checkpoint(path).rng["torch"])
    assert torch.equal(torch.randn(4), after)


def test_latest_pointer_names_newest_step(tmp_path: Path) -> None:
    for step in (2, 10, 5):
        save_checkpoint(tmp_path, _state(step))
    pointer = json.loads((tmp_path / LATEST).read_text())
    # `latest` follows the last write, not the largest number
    assert pointer == {"step": 5, "path": "step-5"}
    assert latest_checkpoint(tmp_path) == tmp_path / "step-5"
    save_checkpoint(tmp_path, _state(12))
    assert json.loads((tmp_path / LATEST).read_text())["path"] == "step-12"
    assert latest_checkpoint(tmp_path) == tmp_path / "step-12"


def test_keep_last_prunes_older_checkpoints_after_the_pointer_moves(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        save_checkpoint(tmp_path, _state(step), keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-6", "step-8"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step-8"
    save_checkpoint(tmp_path, _state(10), keep_last=1)
    assert [p.name for p in tmp_path.glob("step-*")] == ["step-10"]
    assert load_checkpoint(tmp_path / "step-10").step == 10
    save_checkpoint(tmp_path, _state(12))  # no keep_last: nothing is deleted
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-10", "step-12"]


def test_no_checkpoint_gives_none(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "missing") is None


def test_modified_checkpoint_is_skipped_and_refused(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(1))
    newest = save_checkpoint(tmp_path, _state(2))
    weights = newest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))

    assert verify_checkpoint(newest) is not None
    assert latest_checkpoint(tmp_path) == tmp_path / "step-1"
    with pytest.raises(FlowpostError) as info:
        load_checkpoint(newest)
    assert str(newest) in str(info.value)
    assert "model.safetensors" in str(info.value)
    assert load_checkpoint(tmp_path / "step-1").step == 1


def test_checkpoint_with_missing_file_is_skipped(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(3))
    newest = save_checkpoint(tmp_path, _state(4))
    (newest / "optimizer.pt").unlink()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-3"
    with pytest.raises(FlowpostError, match="optimizer.pt"):
        load_checkpoint(newest)


def test_leftovers_without_manifest_are_ignored(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(3))
    # a crash left a temporary directory and a step folder without manifest behind
    (tmp_path / ".step-9.abc123.tmp").mkdir()
    (tmp_path / ".step-9.abc123.tmp" / "model.safetensors").write_bytes(b"partial")
    partial = tmp_path / "step-8"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"partial")
    (tmp_path / "step-notanumber").mkdir()
    assert verify_checkpoint(partial) == "no manifest (partial write)"
    assert latest_checkpoint(tmp_path) == tmp_path / "step-3"
    # even without a pointer, the scan picks the newest intact step
    (tmp_path / LATEST).unlink()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-3"


def test_unreadable_pointer_falls_back_to_scan(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(3))
    save_checkpoint(tmp_path, _state(11))
    (tmp_path / LATEST).write_text("{not json")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-11"


def test_failed_save_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path, _state(1))
    before = (tmp_path / LATEST).read_bytes()
    real = checkpoint.save_file
    calls = {"n": 0}

    def failing(tensors: dict[str, torch.Tensor], filename: Any, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", failing)
    message = "cannot write the checkpoint of step 2 \\(No space left on device\\).*it resumes from step-1"
    with pytest.raises(FlowpostError, match=message):
        save_checkpoint(tmp_path, _state(2))
    assert calls["n"] == 2
    assert not (tmp_path / "step-2").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, "step-1"]
    assert (tmp_path / LATEST).read_bytes() == before
    assert latest_checkpoint(tmp_path) == tmp_path / "step-1"


def test_manifest_lists_every_file(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, _state(4))
    manifest = json.loads((path / MANIFEST).read_text())
    on_disk = {p.name for p in path.iterdir()} - {MANIFEST}
    assert set(manifest["files"]) == on_disk
    assert {"model.safetensors", "optimizer.pt", "state.json", "rng.safetensors"} <= on_disk


def test_optimizer_file_is_loaded_without_pickle_code(tmp_path: Path) -> None:
    # optimizer.pt is read with weights_only=True: an arbitrary object in it is refused
    path = save_checkpoint(tmp_path, _state(1))
    torch.save({"optimizer": Payload(), "scheduler": {}}, path / "optimizer.pt")
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"]["optimizer.pt"] = checkpoint.sha256_file(path / "optimizer.pt")
    (path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(Exception) as info:
        load_checkpoint(path)
    assert "weights_only" in str(info.value) or "Unsupported" in str(info.value)


@pytest.mark.parametrize(
    "pointer", ["[1, 2]", '"step-3"', "null", '{"step": 3}', '{"path": 5}', '{"path": "/etc"}', '{"path": "../x"}']
)
def test_pointer_that_is_json_but_names_no_step_falls_back_to_scan(tmp_path: Path, pointer: str) -> None:
    save_checkpoint(tmp_path, _state(3))
    save_checkpoint(tmp_path, _state(11))
    (tmp_path / LATEST).write_text(pointer)
    assert latest_checkpoint(tmp_path) == tmp_path / "step-11"


def test_a_verified_checkpoint_is_not_hashed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path, _state(2))
    path = latest_checkpoint(tmp_path)
    assert path is not None
    hashed: list[str] = []
    real = io.sha256_file
    monkeypatch.setattr(io, "sha256_file", lambda p: hashed.append(str(p)) or real(p))
    assert load_checkpoint(path, verified=True).step == 2
    assert hashed == []
    assert load_checkpoint(path).step == 2
    assert hashed  # unverified loads still check every file
