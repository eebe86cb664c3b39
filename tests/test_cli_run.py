"""The `flowpost` command end to end, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _flowpost(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PREFECT_HOME": str(cwd / "prefect-home")}
    return subprocess.run(
        [sys.executable, "-m", "flowpost.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_smoke_run_of_the_default_pipeline_then_sample_from_its_export(tmp_path: Path) -> None:
    done = _flowpost("run", "--smoke", "--workspace", "ws", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = json.loads((tmp_path / "ws" / "metrics.json").read_text())
    assert metrics["sft"]["smoke"] is True and metrics["sft"]["step"] == 3
    assert metrics["grpo"]["smoke"] is True and metrics["grpo"]["step"] == 4  # 2 iterations x 2 optimizer steps
    assert "cached" not in done.stdout

    again = _flowpost("run", "--smoke", "--workspace", "ws", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.count("cached") == 8, again.stdout

    export = next((tmp_path / "ws" / "export").iterdir())
    sampled = _flowpost(
        "sample",
        str(export),
        "--prompt",
        "a handwritten digit seven",
        "-n",
        "4",
        "--out",
        "g.png",
        cwd=tmp_path,
    )
    assert sampled.returncode == 0, sampled.stderr
    assert (tmp_path / "g.png").stat().st_size > 0


def test_list_prints_the_registries(tmp_path: Path) -> None:
    trainers = _flowpost("list", "trainers", cwd=tmp_path)
    rewards = _flowpost("list", "rewards", cwd=tmp_path)
    models = _flowpost("list", "models", cwd=tmp_path)
    assert (
        "sft" in [line.split("\t")[0] for line in trainers.stdout.splitlines()]
        and "digit_adherence" in rewards.stdout
        and "tiny-sd3" in models.stdout
    )
    unknown = _flowpost("list", "samplers", cwd=tmp_path)
    assert unknown.returncode == 1 and "trainers, models, rewards, metrics, datasets or encoders" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_config_show_prints_the_resolved_pipeline(tmp_path: Path) -> None:
    import yaml

    shown = _flowpost("config", "show", "--set", "stages.sft.train.lr=1e-4", cwd=tmp_path)
    resolved = yaml.safe_load(shown.stdout)
    assert resolved["stages"]["sft"]["train"]["lr"] == 1e-4
    assert resolved["stages"]["sft"]["train"]["cfg_dropout"] == 0.1  # a default, filled in


@pytest.mark.slow
def test_check_consistency_on_a_grpo_stage_of_a_real_workspace(tmp_path: Path, tiny_pipeline) -> None:
    import yaml

    from flowpost.core.config.loading import validate_pipeline
    from flowpost.tasks.runner import PipelineRun

    config = tiny_pipeline()
    config["stages"]["grpo"] = {
        "trainer": "grpo",
        "model": {"init": "sft", "transformer": config["stages"]["sft"]["model"]["transformer"]},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "sampling": {"steps": 6, "window": 3, "window_start": [0, 2]},
        "rewards": [{"name": "digit_adherence"}],
        "train": {"prompts_per_iteration": 2, "group_size": 4, "train_batch_size": 4, "iterations": 2},
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = PipelineRun(validate_pipeline(config), tmp_path / "ws")
    for node in ("acquire.digits", "conditions.minilm", "train.sft"):
        run.execute(node)
    done = _flowpost("check-consistency", "p.yaml", "--stage", "grpo", "--workspace", "ws", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["max_abs_ratio_error"] < 1e-5 and report["micro_batch"] == 4
