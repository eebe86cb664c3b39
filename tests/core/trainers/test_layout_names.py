"""A parallel layout is named by the ``launch.backend`` that selects it, in checkpoints and events too; a
checkpoint that recorded an older name resumes as the same layout."""

from __future__ import annotations

from typing import get_args

import pytest

from flowpost.core.checkpoint import latest_checkpoint, load_checkpoint
from flowpost.core.config.schema.stages import LaunchConfig
from flowpost.core.events import read_events
from flowpost.core.parallel import RECORDED_NAMES, parallel_layout, recorded_layout
from flowpost.core.parallel.replicated import Replicated
from flowpost.core.trainers.optimizers import OptimizerConfig, check_role_optimizers
from flowpost.errors import FlowpostError

BACKENDS = get_args(LaunchConfig.model_fields["backend"].annotation)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_layout_is_named_by_its_backend_and_one_process_is_ddp(backend: str) -> None:
    assert parallel_layout(backend, 2).name == backend
    assert parallel_layout(backend, 1).name == "ddp"


def test_every_older_name_maps_to_a_backend_and_current_names_stay() -> None:
    assert RECORDED_NAMES == {"replicated": "ddp", "sharded": "fsdp2", "zero2": "deepspeed-zero2"}
    assert [recorded_layout(name) for name in RECORDED_NAMES] == list(BACKENDS)
    assert [recorded_layout(name) for name in BACKENDS] == list(BACKENDS)


def test_role_optimizers_are_checked_against_the_layout_names() -> None:
    adamw, muon = OptimizerConfig(lr=1e-3), OptimizerConfig(name="muon", lr=1e-3)
    check_role_optimizers(("generator",), {"generator": muon}, "ddp", 2, stage="s")
    with pytest.raises(FlowpostError, match="stages.s.launch.backend: deepspeed-zero2 steps one optimizer"):
        check_role_optimizers(("generator",), {"generator": adamw}, "deepspeed-zero2", 2, stage="s")
    with pytest.raises(FlowpostError, match="stages.s.optimizers.generator.name: .* cannot step fsdp2 shards"):
        check_role_optimizers(("generator",), {"generator": muon}, "fsdp2", 2, stage="s")


def test_a_checkpoint_that_recorded_replicated_resumes_as_ddp_without_a_warning(
    make_trainer, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as older:
        older.setattr(Replicated, "name", "replicated")  # the name flowpost recorded before
        make_trainer(tmp_path, max_steps=2).start()
    assert load_checkpoint(latest_checkpoint(tmp_path / "checkpoints")).trainer["layout"] == "replicated"
    assert make_trainer(tmp_path, max_steps=3).start().optimizer_step == 3
    start = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "start"][-1]
    assert start["resumed_from"] is not None and start["layout"] == "ddp"
    assert "resumed_with_layout_from" not in start
    assert load_checkpoint(latest_checkpoint(tmp_path / "checkpoints")).trainer["layout"] == "ddp"
