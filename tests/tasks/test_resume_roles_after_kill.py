"""A multi-role (dmd2) stage killed with SIGKILL resumes to the same weights and optimizer state in
every role as an uninterrupted run, on one process and on two (ddp and fsdp2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flowpost.core.checkpoint import latest_checkpoint, load_checkpoint
from flowpost.core.config.loading import validate_pipeline
from flowpost.core.events import read_events
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.runner import PipelineRun
from flowpost.tasks.train import run_training, stage_spec

ITERATIONS = 6


def _dmd2_pipeline(tiny_pipeline, processes: int, backend: str) -> dict:
    config = tiny_pipeline()
    config["smoke"] = False
    config["stages"]["dmd2"] = {
        "trainer": "dmd2",
        "model": {"family": "tiny-sd3", "init": "sft", "transformer": config["stages"]["sft"]["model"]["transformer"]},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "sampling": {"dynamics": "ode", "steps": 2},
        "optimizers": {"generator": {"lr": 1e-3}, "fake_score": {"lr": 1e-3, "warmup_steps": 3}},
        "train": {
            "iterations": ITERATIONS,
            "prompts_per_iteration": 4,
            "rollout_batch_size": 4,
            "train_batch_size": 2,
            "ttur": 2,
            "real_guidance": 2.0,
            "checkpoint_every": 1,
        },
        "callbacks": {"ema": {"decay": 0.9}},
        "launch": {"num_processes": processes, "backend": backend},
    }
    return config


def _final_state(stage_dir: Path) -> tuple[dict[str, torch.Tensor], dict]:
    state = load_checkpoint(latest_checkpoint(stage_dir / "checkpoints"))
    return state.model, {"generator": state.optimizer, **state.roles}


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


@pytest.mark.slow
@pytest.mark.parametrize(("processes", "backend"), [(1, "ddp"), (2, "ddp"), (2, "fsdp2")])
def test_sigkill_mid_dmd2_stage_then_resume_matches_an_uninterrupted_run(tmp_path, tiny_pipeline, processes, backend):
    run = PipelineRun(validate_pipeline(_dmd2_pipeline(tiny_pipeline, processes, backend)), tmp_path / "ws")
    for node in ("acquire.digits", "conditions.minilm"):
        run.execute(node)
    inputs = {
        "dataset_dir": run.path("acquire.digits"),
        "conditions_dir": run.path("conditions.minilm"),
        "encoder_fingerprint": encoder_fingerprint(run.path("conditions.minilm")),
        "init_from": None,
    }
    run_training(stage_spec(run.pipeline, "dmd2", tmp_path / "straight", **inputs))

    killed = stage_spec(run.pipeline, "dmd2", tmp_path / "killed", **inputs)
    (tmp_path / "killed").mkdir()
    killed.write(tmp_path / "killed" / "stage.json")
    process = subprocess.Popen(
        [sys.executable, "-m", "flowpost.stage", str(tmp_path / "killed" / "stage.json")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not any(
        e["event"] == "checkpoint" and e["iteration"] >= 2 for e in read_events(tmp_path / "killed" / "events.jsonl")
    ):
        assert process.poll() is None and time.monotonic() < deadline, "stage ended before it could be killed"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "killed" / "final").exists()

    assert run_training(killed).iteration == ITERATIONS
    start = [e for e in read_events(tmp_path / "killed" / "events.jsonl") if e["event"] == "start"]
    assert start[-1]["resumed_from"] is not None and 2 <= start[-1]["iteration"] < ITERATIONS
    (model_a, optimizers_a), (model_b, optimizers_b) = (
        _final_state(tmp_path / "straight"),
        _final_state(tmp_path / "killed"),
    )
    assert {key.split(".")[0] for key in model_a} == {"generator", "fake_score"}
    assert _equal(model_a, model_b) and _equal(optimizers_a, optimizers_b)
    live = "final/live/transformer/diffusion_pytorch_model.safetensors"
    assert _equal(load_file(tmp_path / "straight" / live), load_file(tmp_path / "killed" / live))
