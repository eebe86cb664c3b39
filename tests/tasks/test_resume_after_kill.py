"""A training stage killed with SIGKILL resumes from its latest checkpoint to identical weights."""

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

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.events import read_events
from flowpost.core.io import read_json
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.runner import PipelineRun
from flowpost.tasks.train import run_training, stage_spec


def _weights(stage_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(stage_dir / "final" / "live" / "transformer" / "diffusion_pytorch_model.safetensors")


@pytest.mark.slow
def test_sigkill_mid_stage_then_resume_matches_an_uninterrupted_run(tmp_path: Path, tiny_pipeline) -> None:
    config = tiny_pipeline(max_steps=24, checkpoint_every=4, gradient_accumulation_steps=2)
    config["smoke"] = False
    run = PipelineRun(validate_pipeline(config), tmp_path / "ws")
    for node in ("acquire.digits", "conditions.minilm"):
        run.execute(node)
    inputs = {
        "dataset_dir": run.path("acquire.digits"),
        "conditions_dir": run.path("conditions.minilm"),
        "encoder_fingerprint": encoder_fingerprint(run.path("conditions.minilm")),
        "init_from": None,
    }
    straight = stage_spec(run.pipeline, "sft", tmp_path / "straight", **inputs)
    run_training(straight)

    killed = stage_spec(run.pipeline, "sft", tmp_path / "killed", **inputs)
    (tmp_path / "killed").mkdir()
    killed.write(tmp_path / "killed" / "stage.json")
    process = subprocess.Popen(
        [sys.executable, "-m", "flowpost.stage", str(tmp_path / "killed" / "stage.json")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not any(
        e["event"] == "checkpoint" and e["step"] >= 8 for e in read_events(tmp_path / "killed" / "events.jsonl")
    ):
        assert process.poll() is None and time.monotonic() < deadline, "stage ended before it could be killed"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "killed" / "final").exists()

    done = run_training(killed)
    assert done.step == 24
    start = [e for e in read_events(tmp_path / "killed" / "events.jsonl") if e["event"] == "start"]
    assert start[-1]["resumed_from"] is not None and start[-1]["step"] >= 8
    expected, actual = _weights(tmp_path / "straight"), _weights(tmp_path / "killed")
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[key], actual[key]) for key in expected)
    # the resumed stage's cost ledger covers the whole stage: the killed run up to its last checkpoint too
    whole = read_json(tmp_path / "killed" / "final" / "cost.json")
    once = read_json(tmp_path / "straight" / "final" / "cost.json")
    assert (whole["runs"], once["runs"]) == (2, 1) and whole["samples"] == once["samples"] == 24 * 8 * 2
    assert sum(whole["phases"].values()) <= whole["wall_seconds"]
