"""``evaluate.every``: the eval node scores a tiny stage's checkpoints at multiples of it plus the final
weights into ``curve.json``, which the report shows; the checkpoints' weights are what training saved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.evaluation.checkpoint_weights import load_checkpoint_weights
from flowpost.core.models.registry import load_adapter
from flowpost.tasks.runner import PipelineRun


def curve_pipeline(tiny_pipeline, **evaluate: Any) -> dict[str, Any]:
    """The tiny pipeline at full budget (4 steps, a checkpoint at each), its curve every 2 steps."""
    data = {**tiny_pipeline(max_steps=4, checkpoint_every=1), "smoke": False}
    data["evaluate"] = {**data["evaluate"], "every": 2, **evaluate}
    return data


@pytest.fixture(scope="module")
def curve_run(tiny_pipeline, tmp_path_factory: pytest.TempPathFactory) -> PipelineRun:
    run = PipelineRun(validate_pipeline(curve_pipeline(tiny_pipeline)), tmp_path_factory.mktemp("curve"))
    for node_id in run.nodes:
        run.execute(node_id)
    return run


def test_the_curve_scores_every_second_checkpoint_and_ends_with_the_final_metrics(curve_run: PipelineRun) -> None:
    out = curve_run.path("eval.sft")
    metrics = json.loads((out / "metrics.json").read_text())
    curve = json.loads((out / "curve.json").read_text())
    checkpoints = sorted(p.name for p in (curve_run.path("train.sft") / "checkpoints").glob("step-*"))
    assert checkpoints == ["step-1", "step-2", "step-3", "step-4"]
    assert [row["step"] for row in curve] == [2, 4]
    assert metrics["curve"] == str(out / "curve.json") and metrics["step"] == 4
    assert curve[-1] == {"step": 4, **{key: metrics[key] for key in metrics["metrics"]}}
    assert set(curve[0]) == {"step", "adherence", "reward_mean", "fd"}
    assert curve[0]["fd"] != curve[-1]["fd"]  # two more optimizer steps change the samples


def test_a_checkpoints_ema_weights_are_the_ones_training_saved(curve_run: PipelineRun) -> None:
    train = curve_run.path("train.sft")
    final = load_adapter(train / "final" / "ema")
    adapter = load_adapter(train / "final" / "ema")
    progress = load_checkpoint_weights(adapter, train / "checkpoints" / "step-2", weights="ema")
    assert progress.optimizer_step == 2
    before = {k: v.clone() for k, v in adapter.module().state_dict().items()}
    assert any(not torch.equal(before[k], v) for k, v in final.module().state_dict().items())
    load_checkpoint_weights(adapter, train / "checkpoints" / "step-4", weights="ema")
    after = adapter.module().state_dict()
    assert all(torch.equal(after[k], v) for k, v in final.module().state_dict().items())


def test_the_report_has_a_table_of_the_curve(curve_run: PipelineRun) -> None:
    report = (curve_run.path("report") / "report.md").read_text()
    curve = json.loads((curve_run.path("eval.sft") / "curve.json").read_text())
    assert "## sft over checkpoints" in report
    assert "| step | adherence | reward_mean | fd |" in report
    for row in curve:
        assert f"| {row['step']} | {row['adherence']:.4g} | {row['reward_mean']:.4g} | {row['fd']:.4g} |" in report


def test_without_every_the_eval_node_writes_no_curve(completed_workspace: tuple[Path, dict[str, str]], tiny_pipeline) -> None:
    workspace, _ = completed_workspace
    run = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    assert not (run.path("eval.sft") / "curve.json").exists()
    assert "curve" not in json.loads((run.path("eval.sft") / "metrics.json").read_text())
    assert "over checkpoints" not in (run.path("report") / "report.md").read_text()
