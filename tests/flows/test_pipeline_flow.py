"""A real Prefect flow run of a tiny pipeline under ``prefect_test_harness``."""

from __future__ import annotations

import json
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


def test_a_failing_stage_fails_the_flow_naming_the_rank(prefect_harness, tiny_pipeline, tmp_path: Path) -> None:
    from flowpost.flows.pipeline import pipeline_flow

    broken = tiny_pipeline()
    broken["stages"]["sft"]["model"]["transformer"]["num_attention_heads"] = 3  # incompatible with the width
    with pytest.raises(FlowpostError, match="rank 0"):
        pipeline_flow(broken, str(tmp_path))
    assert not (tmp_path / "metrics.json").exists()
