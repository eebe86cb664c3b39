"""The guard against a hacked reward: GRPO on mean brightness makes the digits brighter while the judge's
adherence falls; the guard stops the stage, and the export is its last good checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.events import read_events
from flowpost.core.io import read_json
from flowpost.tasks.runner import PipelineRun

pytestmark = pytest.mark.slow

SMALL = {"num_layers": 2, "num_attention_heads": 4, "attention_head_dim": 16, "caption_projection_dim": 64}
MAX_DROP = 0.1
CHECK = {"samples": 100, "steps": 10, "seed": 4321, "batch_size": 100}  # the guard's samples and the evaluation's


def hacked_pipeline() -> dict[str, Any]:
    """SFT on the digits, then GRPO rewarded by brightness alone, guarded by the judge's adherence."""
    data = {"dataset": "digits", "conditions": "minilm"}
    return {
        "name": "hacked",
        "seed": 0,
        "datasets": {"digits": {"source": "builtin-digits"}},
        "conditions": {"minilm": {"encoder": "minilm", "datasets": ["digits"]}},
        "stages": {
            "sft": {
                "trainer": "sft",
                "model": {"family": "tiny-sd3", "transformer": SMALL},
                "data": data,
                "train": {"lr": 1e-3, "batch_size": 32, "max_steps": 300, "warmup_steps": 10, "cfg_dropout": 0.1},
                "callbacks": {"ema": {"decay": 0.95}},
            },
            "hack": {
                "trainer": "grpo",
                "model": {"family": "tiny-sd3", "init": "sft", "init_weights": "ema"},
                "data": data,
                "sampling": {"dynamics": "flow-sde", "steps": 8, "noise_level": 0.7},
                "rewards": [{"name": "mean_brightness"}],
                "train": {
                    "lr": 1.5e-4,
                    "iterations": 12,
                    "prompts_per_iteration": 4,
                    "group_size": 8,
                    "rollout_batch_size": 32,
                    "train_batch_size": 32,
                    "clip_range": 1e-3,
                    "log_every": 1,
                },
                "guard": {"metric": "adherence", "max_drop": MAX_DROP, "every": 1, **CHECK},
            },
        },
        "evaluate": {"after": ["hack"], "weights": "live", **CHECK},
        "export": {"from": "hack"},
    }


def test_the_guard_stops_a_hacked_reward_at_the_last_good_checkpoint(tmp_path: Path) -> None:
    run = PipelineRun(validate_pipeline(hacked_pipeline()), tmp_path)
    results = {node: run.execute(node) for node in run.nodes}

    guard = results["train.hack"].outputs["guard"]
    assert guard["fired"], guard
    start, fired = guard["start"]["adherence"], guard["values"]["adherence"]
    assert fired < start - MAX_DROP and "adherence" in guard["violations"][0]

    events = read_events(run.path("train.hack") / "events.jsonl")
    rewards = [e["metrics"]["reward/mean_brightness_mean"] for e in events if e["event"] == "progress"]
    assert rewards[guard["at_iteration"] - 1] > rewards[0] + 0.03  # brightness rose while the judge fell

    good = guard["ended_with"]
    assert good == guard["at"] - 1  # the check before the violation (one optimizer step per iteration)
    assert (guard["at_iteration"], guard["ended_with_iteration"]) == (guard["at"], good)
    exported = load_file(run.path("export") / "transformer" / "diffusion_pytorch_model.safetensors")
    checkpoint = load_file(run.path("train.hack") / "checkpoints" / f"step-{good}" / "model.safetensors")
    assert exported.keys() == checkpoint.keys()
    assert all(torch.equal(exported[key], checkpoint[key]) for key in exported)
    assert read_json(run.path("export") / "export.json")["step"] == good

    judged = read_json(run.path("eval.hack") / "metrics.json")
    assert judged["step"] == good and start - judged["adherence"] <= MAX_DROP  # the guard's own criterion
    report = (run.path("report") / "report.md").read_text()
    assert "guard of stage 'hack' fired" in report
