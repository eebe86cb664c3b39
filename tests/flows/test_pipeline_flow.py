"""A real Prefect flow run of a tiny pipeline under ``prefect_test_harness``."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest

from flowpost.errors import FlowpostError


def test_flow_runs_every_node_then_reuses_them(prefect_harness, tiny_pipeline, tmp_path: Path) -> None:
    from flowpost.flows.pipeline import pipeline_flow

    first = pipeline_flow(tiny_pipeline(), str(tmp_path))
    assert [r.node for r in first] == [
        "acquire.digits",
        "conditions.minilm",
        "train.sft",
        "eval.sft",
        "export",
        "report",
    ]
    assert {r.status for r in first} == {"ran"}
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["sft"]["step"] == 3 and metrics["sft"]["n_samples"] == 20
    second = pipeline_flow(tiny_pipeline(), str(tmp_path))
    assert {r.status for r in second} == {"cached"}
    table = _artifact("metrics-train-sft")
    assert table.type == "table"
    rows = json.loads(table.data)
    assert [row["step"] for row in rows] == [1, 2, 3] and all(row["loss"] > 0 for row in rows)
    report = _artifact("tiny-report")  # the sample grid itself, not only its path
    grid = next(r.path for r in first if r.node == "eval.sft") / "grid.png"
    assert report.type == "markdown" and f"base64,{base64.b64encode(grid.read_bytes()).decode()})" in report.data
    cost = _artifact("tiny-cost")  # the stages' cost ledgers, as report.md's Cost table
    assert cost.type == "table" and [row["stage"] for row in json.loads(cost.data)] == ["sft"]
    assert json.loads(cost.data)[0]["wall_s"] > 0 and json.loads(cost.data)[0]["optimize_s"] > 0


def _artifact(key: str):  # noqa: ANN202
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key}"
    return found[-1]


def test_a_failing_stage_fails_the_flow_naming_the_rank(
    prefect_harness, tiny_pipeline, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from flowpost.flows.pipeline import pipeline_flow

    broken = tiny_pipeline()
    broken["stages"]["sft"]["model"]["transformer"]["num_attention_heads"] = 3  # incompatible with the width
    broken["stages"]["sft"]["model"]["lora"] = {"rank": 4096}  # above the width: a warning, once per run
    logger = logging.getLogger("flowpost.core.config.loading")
    logger.addHandler(caplog.handler)  # the flowpost loggers may not propagate to the root
    try:
        for log_warnings in (True, False):  # `flowpost run` printed them already: it turns them off
            caplog.clear()
            with pytest.raises(FlowpostError, match="rank 0"):
                pipeline_flow(broken, str(tmp_path), log_warnings=log_warnings)
            warned = {id(r): r for r in caplog.records if "lora.rank: 4096 is above the width" in r.getMessage()}
            assert len(warned) == int(log_warnings), caplog.records
    finally:
        logger.removeHandler(caplog.handler)
    assert not (tmp_path / "metrics.json").exists()


def test_ddp_two_process_training_stage_runs_inside_the_flow(prefect_harness, tiny_pipeline, tmp_path: Path) -> None:
    from flowpost.flows.pipeline import pipeline_flow

    config = tiny_pipeline()
    config["stages"]["sft"]["launch"] = {"num_processes": 2}
    results = {r.node: r for r in pipeline_flow(config, str(tmp_path))}
    stage_dir = results["train.sft"].path
    assert sorted(p.name for p in (stage_dir / "logs").glob("rank-*.log")) == ["rank-0.log", "rank-1.log"]
    done = [json.loads(line) for line in (stage_dir / "events.jsonl").read_text().splitlines()][-1]
    assert done["event"] == "done" and done["ranks"] == 2
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["sft"]["step"] == 3


def test_metrics_table_has_one_column_per_metric_seen() -> None:
    from flowpost.flows.pipeline import metrics_table

    rows = metrics_table([{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25, "lr": 1e-4}])
    assert rows == [{"step": 1, "loss": 0.5, "lr": ""}, {"step": 2, "loss": 0.25, "lr": 0.0001}]
