"""A kd pipeline end to end: the teacher-trajectories node samples the finished SFT stage, the kd
stage trains on it, and the node is content-addressed (cached on a rerun, resampled when its teacher
changes)."""

from __future__ import annotations

import pytest

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.io import read_json
from flowpost.tasks.runner import PipelineRun

TINY = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}


def _kd_pipeline(tiny_pipeline, **sft_train) -> dict:
    pipeline = tiny_pipeline(**sft_train)
    pipeline["datasets"]["odes"] = {
        "source": "teacher-trajectories",
        "trajectories": {"stage": "sft", "prompts": "digits", "conditions": "minilm", "steps": 2, "substeps": 2},
    }
    pipeline["stages"]["kd"] = {
        "trainer": "kd",
        "model": {"family": "tiny-sd3", "init": "sft", "transformer": dict(TINY)},
        "data": {"dataset": "odes", "conditions": "minilm"},
        "train": {"batch_size": 4, "max_steps": 2},
    }
    pipeline["evaluate"]["after"] = ["sft", "kd"]
    pipeline["export"] = {"from": "kd"}
    return pipeline


@pytest.mark.slow
def test_a_kd_pipeline_samples_its_teacher_once_and_again_when_the_teacher_changes(tiny_pipeline, tmp_path):
    run = PipelineRun(validate_pipeline(_kd_pipeline(tiny_pipeline)), tmp_path)
    statuses = {node: run.execute(node).status for node in run.nodes}
    assert set(statuses.values()) == {"ran"}
    manifest = read_json(run.path("acquire.odes") / "manifest.json")
    assert manifest["counts"] == {"train": 16} and len(manifest["trajectory"]["sigmas"]) == 3
    assert read_json(run.path("eval.kd") / "metrics.json")["n_samples"] == 20

    again = PipelineRun(validate_pipeline(_kd_pipeline(tiny_pipeline)), tmp_path)
    assert {again.execute(node).status for node in again.nodes} == {"cached"}

    changed = PipelineRun(validate_pipeline(_kd_pipeline(tiny_pipeline, lr=2e-3)), tmp_path)
    assert changed.fingerprints["acquire.odes"] != run.fingerprints["acquire.odes"]
    assert changed.fingerprints["acquire.digits"] == run.fingerprints["acquire.digits"]
    assert changed.fingerprints["train.kd"] != run.fingerprints["train.kd"]
