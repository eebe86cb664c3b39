"""The digits offline DPO example end to end in smoke mode: sft -> sampled pairs -> offline-dpo -> eval."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowpost.core.config.loading import load_pipeline
from flowpost.core.io import read_json
from flowpost.tasks.runner import PipelineRun

EXAMPLE = Path(__file__).parents[2] / "examples" / "digits-offline-dpo.yaml"
SMALL = ["smoke=true", "evaluate.samples=20", "stages.sft.train.batch_size=16"]


@pytest.mark.slow  # about a minute: classifiers, two training processes, sampling and two evaluations
def test_the_example_runs_and_a_dpo_change_reuses_the_pairs(tmp_path: Path) -> None:
    run = PipelineRun(load_pipeline(EXAMPLE, SMALL), tmp_path / "ws")
    order = list(run.nodes)
    assert order.index("train.sft") < order.index("acquire.pairs") < order.index("train.dpo")
    results = {node: run.execute(node) for node in order}
    assert {result.status for result in results.values()} == {"ran"}
    pairs = read_json(run.path("acquire.pairs") / "manifest.json")
    assert pairs["counts"]["train"] + pairs["counts"]["skipped_groups"] == 40  # one round of the 40 prompts
    assert pairs["rewards"]["chosen_mean"] > pairs["rewards"]["rejected_mean"]
    assert results["train.dpo"].outputs["step"] == 3
    assert read_json(run.path("eval.dpo") / "metrics.json")["step"] == 3

    changed = PipelineRun(load_pipeline(EXAMPLE, [*SMALL, "stages.dpo.train.lr=1e-5"]), tmp_path / "ws")
    statuses = {node: changed.execute(node).status for node in ("train.sft", "acquire.pairs", "train.dpo")}
    assert statuses == {"train.sft": "cached", "acquire.pairs": "cached", "train.dpo": "ran"}
