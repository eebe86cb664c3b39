"""The W&B tracker on a real (offline) W&B run: who the run is, what a stage logs to it, resuming it, and
the error when it cannot log online."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowpost.core.callbacks.tracking import RunIdentity, WandbTracker
from flowpost.errors import FlowpostError


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    for name in ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def _identity(tmp_path: Path) -> RunIdentity:
    return RunIdentity(pipeline="nightly", stage="grpo", trainer="grpo", family="sd3", output_dir=tmp_path / "stage")


def test_the_run_is_named_grouped_and_tagged_from_the_pipeline_and_stage(offline, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_ENTITY", "lab")
    tracker = WandbTracker(tmp_path / "logs", _identity(tmp_path))
    run = tracker.run
    try:
        assert (run.project, run.entity, run.name, run.group, run.job_type) == (
            "nightly",
            "lab",
            "nightly/grpo",
            "nightly",
            "grpo",
        )
        assert set(run.tags) == {"nightly", "grpo", "sd3"} and run.offline
    finally:
        tracker.close()
    monkeypatch.setenv("WANDB_PROJECT", "team-project")
    again = WandbTracker(tmp_path / "logs", _identity(tmp_path))
    try:
        assert again.run.project == "team-project"
        assert again.run.id == run.id  # the same stage folder continues its run
    finally:
        again.close()


def test_a_stage_logs_its_metrics_grids_and_cost_to_wandb(offline, make_trainer, tmp_path) -> None:
    validation = {"every": 2, "prompts": ["digit 1"], "samples_per_prompt": 2, "steps": 2}
    trainer = make_trainer(
        tmp_path / "stage", callbacks={"trackers": ["wandb"], "validation": validation}, max_steps=4, log_every=1
    )
    trainer.start()
    (run_dir,) = (tmp_path / "stage" / "logs" / "wandb" / "wandb").glob("offline-run-*")
    grids = sorted(p.name for p in (run_dir / "files" / "media" / "images" / "validation").glob("grid_*.png"))
    assert len(grids) == 2  # steps 2 and 4
    assert trainer.cost is not None and trainer.cost["samples"] > 0


def test_online_without_credentials_is_a_clear_error(offline, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    with pytest.raises(FlowpostError, match=r"callbacks.trackers: the wandb tracker could not start a run in online"):
        WandbTracker(tmp_path / "logs", _identity(tmp_path))
