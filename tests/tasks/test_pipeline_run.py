"""The node graph run bare (no Prefect): outputs, caching by fingerprint, selective reruns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.runner import PipelineRun

EXPECTED_NODES = [
    "acquire.digits",
    "conditions.minilm",
    "train.sft",
    "eval.sft",
    "export",
    "report",
]


def _run_all(run: PipelineRun) -> dict[str, str]:
    statuses = {node_id: run.execute(node_id).status for node_id in run.nodes}
    run.publish_report()
    return statuses


@pytest.fixture(scope="module")
def workspace(completed_workspace: tuple[Path, dict[str, str]]) -> Path:
    workspace, statuses = completed_workspace
    assert list(statuses) == EXPECTED_NODES
    assert set(statuses.values()) == {"ran"}
    return workspace


def test_report_has_the_promised_metrics(workspace: Path) -> None:
    metrics = json.loads((workspace / "metrics.json").read_text())
    assert set(metrics["sft"]) == {
        "adherence",
        "reward_mean",
        "fd",
        "n_samples",
        "step",
        "weights",
        "seed",
        "smoke",
        "cost",
    }
    assert metrics["sft"]["n_samples"] == 20 and metrics["sft"]["step"] == 3
    assert metrics["sft"]["weights"] == "ema" and metrics["sft"]["smoke"] is True
    assert 0.0 <= metrics["sft"]["adherence"] <= 1.0 and metrics["sft"]["fd"] >= 0.0
    assert "| sft |" in (workspace / "report.md").read_text()


def test_the_report_carries_each_stage_s_cost_ledger(workspace: Path) -> None:
    cost = json.loads((workspace / "metrics.json").read_text())["sft"]["cost"]
    assert set(cost["phases"]) == {"data", "optimize", "checkpoint"}
    assert all(seconds > 0 for seconds in cost["phases"].values())
    assert sum(cost["phases"].values()) <= cost["wall_seconds"]
    assert cost["samples"] == 3 * 8 and cost["sample_kind"] == "training examples"  # max_steps x batch_size
    assert cost["samples_per_second"] > 0 and cost["images_per_gpu_per_second"] > 0
    assert cost["memory_kind"] == "cpu_peak_rss" and cost["peak_memory_bytes"] > 0
    assert "reward_gained" not in cost  # the first stage: nothing before it to gain over
    report = (workspace / "report.md").read_text()
    assert "## Cost" in report and "| stage | wall_s | data_s | optimize_s | checkpoint_s |" in report
    assert report.count("| sft |") == 2  # the metrics table's row and the cost table's


def test_rerun_is_all_cached_and_a_changed_stage_reruns_only_its_dependents(workspace: Path, tiny_pipeline) -> None:
    same = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    assert set(_run_all(same).values()) == {"cached"}
    changed = PipelineRun(validate_pipeline(tiny_pipeline(lr=5e-4)), workspace)
    statuses = _run_all(changed)
    assert statuses == {
        "acquire.digits": "cached",
        "conditions.minilm": "cached",
        "train.sft": "ran",
        "eval.sft": "ran",
        "export": "ran",
        "report": "ran",
    }
    reverted = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    assert set(_run_all(reverted).values()) == {"cached"}


def test_export_loads_with_diffusers_and_matches_the_trained_weights(workspace: Path, tiny_pipeline) -> None:
    from diffusers import SD3Transformer2DModel

    from flowpost.core.models.registry import load_adapter

    run = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    export = run.path("export")
    manifest = json.loads((export / "export.json").read_text())
    assert manifest["encoder"]["name"] == "minilm" and manifest["schedule"]["shift"] == 1.0
    assert manifest["encoder_max_length"] == manifest["encoder"]["max_length"] == 16
    assert manifest["encoder"]["fingerprint"] == encoder_fingerprint(run.path("conditions.minilm"))
    assert manifest["model"]["encoder_max_length"] == 16
    assert set(manifest["provenance"]) == {"git", "versions", "fingerprints", "config"}
    assert manifest["provenance"]["fingerprints"]["train.sft"] == run.fingerprints["train.sft"]
    assert (export / "README.md").read_text().startswith("# tiny")

    plain = SD3Transformer2DModel.from_pretrained(export / "transformer").eval()
    trained = load_adapter(run.path("train.sft") / "final" / "ema").module().eval()
    x = torch.randn(2, 1, 16, 16)
    cond = torch.randn(2, 16, 384)
    pooled = torch.randn(2, 384)
    t = torch.tensor([500.0, 250.0])
    with torch.no_grad():
        a = plain(hidden_states=x, encoder_hidden_states=cond, pooled_projections=pooled, timestep=t).sample
        b = trained(hidden_states=x, encoder_hidden_states=cond, pooled_projections=pooled, timestep=t).sample
    assert torch.equal(a, b)


def test_sample_command_writes_a_grid_from_the_export(workspace: Path, tmp_path: Path, tiny_pipeline) -> None:
    from PIL import Image

    from flowpost.core.sampling.generate import sample_prompts

    run = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    out = tmp_path / "grid.png"
    images, _ = sample_prompts(run.path("export"), ["a handwritten digit seven"] * 4, out=out, steps=2)
    assert images.shape == (4, 1, 16, 16) and 0.0 <= float(images.min()) and float(images.max()) <= 1.0
    assert Image.open(out).size[0] > 16


def test_a_node_whose_inputs_are_missing_is_refused(tmp_path: Path, tiny_pipeline) -> None:
    from flowpost.errors import FlowpostError

    run = PipelineRun(validate_pipeline(tiny_pipeline()), tmp_path)
    with pytest.raises(FlowpostError, match="acquire.digits"):
        run.execute("conditions.minilm")


def test_plan_names_cached_nodes_and_why_the_others_would_run(workspace: Path, tiny_pipeline) -> None:
    from flowpost.tasks.plan import plan_run

    same = {row.node: row for row in plan_run(PipelineRun(validate_pipeline(tiny_pipeline()), workspace))}
    assert {row.status for row in same.values()} == {"cached"} and list(same) == EXPECTED_NODES

    changed = plan_run(PipelineRun(validate_pipeline(tiny_pipeline(lr=2e-4)), workspace))  # never run
    rows = {row.node: row for row in changed}
    assert [row.node for row in changed if row.status == "run"] == ["train.sft", "eval.sft", "export", "report"]
    assert "config train.lr: " in rows["train.sft"].reason and "-> 0.0002" in rows["train.sft"].reason
    assert "train.sft changed" in rows["eval.sft"].reason and "config" not in rows["eval.sft"].reason
    assert rows["acquire.digits"].status == "cached"

    refreshed = plan_run(PipelineRun(validate_pipeline(tiny_pipeline()), workspace), refresh=True)
    assert {row.reason for row in refreshed} == {"--refresh"}


def test_plan_on_an_empty_workspace_runs_everything(tmp_path: Path, tiny_pipeline) -> None:
    from flowpost.tasks.plan import plan_run

    rows = plan_run(PipelineRun(validate_pipeline(tiny_pipeline()), tmp_path))
    assert [(row.status, row.reason) for row in rows] == [("run", "no earlier result")] * len(EXPECTED_NODES)
