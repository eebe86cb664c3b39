"""``evaluate.every``: the eval node scores a tiny stage's checkpoints at multiples of it plus the final
weights into ``curve.json``, which the report shows; the checkpoints' weights are what training saved."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.evaluation.checkpoint_weights import load_checkpoint_weights
from flowpost.core.models.registry import load_adapter
from flowpost.tasks.dvc import dvc_stages
from flowpost.tasks.runner import PipelineRun

pytestmark = pytest.mark.slow  # a real 4-step stage and three evaluations of it


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
    # adherence (better high), the reward (high) and fd (low): three pairs, each plotted beside the report
    assert "## Trade-offs over checkpoints" in report
    for pair in ("adherence-reward_mean", "adherence-fd", "reward_mean-fd"):
        assert (curve_run.path("report") / f"pareto-{pair}.png").is_file() and f"pareto-{pair}.png" in report


def test_without_every_the_eval_node_writes_no_curve(
    completed_workspace: tuple[Path, dict[str, str]], tiny_pipeline
) -> None:
    workspace, _ = completed_workspace
    run = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    assert not (run.path("eval.sft") / "curve.json").exists()
    assert "curve" not in json.loads((run.path("eval.sft") / "metrics.json").read_text())
    assert "over checkpoints" not in (run.path("report") / "report.md").read_text()


def test_the_flow_publishes_the_curve_as_a_table_artifact(prefect_harness, curve_run: PipelineRun) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flowpost.flows.pipeline import pipeline_flow

    results = pipeline_flow(curve_run.pipeline.model_dump(mode="json", by_alias=True), str(curve_run.workspace))
    assert {r.status for r in results} == {"cached"}  # the artifact comes from the node's folder
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["curve-sft"])))
    assert found and found[-1].type == "table"
    rows = json.loads(found[-1].data)
    curve = json.loads((curve_run.path("eval.sft") / "curve.json").read_text())
    assert [row["step"] for row in rows] == [2, 4]
    assert [row["fd"] for row in rows] == pytest.approx([row["fd"] for row in curve], abs=1e-6)


def test_dvc_plots_show_renders_the_curve_over_step(curve_run: PipelineRun, tmp_path: Path) -> None:
    stages = dvc_stages(curve_run.pipeline)
    curve_file = "workspace/eval/sft/curve.json"
    assert stages["plots"] == [
        {f"sft-{m}": {"x": "step", "y": {curve_file: m}, "title": f"sft: {m} over checkpoints"}}
        for m in ("adherence", "reward_mean", "fd")
    ]
    assert "workspace/stages/sft/checkpoints" in stages["stages"]["eval.sft"]["deps"]
    assert "evaluate.every" in stages["stages"]["eval.sft"]["params"]
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def sh(*args: str) -> str:
        done = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    sh("git", "init", "-q")
    sh(sys.executable, "-m", "dvc", "init", "-q")
    pipeline = curve_run.pipeline.model_dump(mode="json", by_alias=True)
    (repo / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    sh(sys.executable, "-m", "flowpost.cli", "dvc", "sync", "pipeline.yaml")
    curve = repo / "workspace" / "eval" / "sft" / "curve.json"
    curve.parent.mkdir(parents=True)
    shutil.copy(curve_run.path("eval.sft") / "curve.json", curve)
    shown = json.loads(sh(sys.executable, "-m", "dvc", "plots", "show", "--json"))["data"]
    rows = json.loads(curve.read_text())
    for metric in ("adherence", "reward_mean", "fd"):  # a plot per metric, a point per scored step
        (plot,) = shown[f"sft-{metric}"]
        assert plot["content"]["title"]["text"] == f"sft: {metric} over checkpoints"
        values = plot["content"]["data"]["values"]
        assert [point["step"] for point in values] == [2, 4]
        assert [point[metric] for point in values] == [row[metric] for row in rows]
