"""A scheduled SD3-family pipeline (the tiny folder SFT, run by ``flows/retrain.py``'s flow, which reloads the
pipeline file each night) promoted or held by a PickScore gate, scored by a tiny random CLIP on DrawBench-style
test prompts. A random CLIP rates no image better for a reason, so the outcome is set by construction, not by
the metric: two trainings are scored first (their nodes are then cached for the nights), and the nights run the
worse, the better, then the worse again. Each decision is the gate's real comparison of measured values."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tiny_clip import build_tiny_clip

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.runner import PipelineRun

REPO = Path(__file__).resolve().parents[2]
GATE = "pickscore"
PROMPTS = "Prompts,Category\na red car,colors\na blue dog,colors\nthree cats,counting\ntwo birds,counting\n"


def _nightly(tiny_pipeline: Any, tmp_path: Path, steps: int) -> dict[str, Any]:
    """``examples/folder-sft.yaml`` with the tests' tiny transformer trained ``steps`` steps, evaluated on a
    DrawBench file with PickScore under a tiny random CLIP, its export gated on that PickScore."""
    config = yaml.safe_load((REPO / "examples" / "folder-sft.yaml").read_text())
    config["smoke"] = True
    config["datasets"]["shapes"]["path"] = str(REPO / "tests" / "data" / "folder")
    config["datasets"]["bench"] = {"source": "prompt-files", "path": str(tmp_path / "drawbench.csv")}
    config["conditions"]["minilm"]["datasets"].append("bench")
    sft = config["stages"]["sft"]
    sft["model"]["transformer"] = copy.deepcopy(tiny_pipeline()["stages"]["sft"]["model"]["transformer"])
    sft["train"].update(max_steps=steps, warmup_steps=0, checkpoint_every=0)
    clip = {"name": GATE, "options": {"model": str(tmp_path / "clip")}}
    config["evaluate"].update(dataset="bench", metrics=[clip], samples=8, seeds=[0], steps=2, batch_size=8)
    config["export"]["promote"] = {"metrics": [GATE]}
    return config


@pytest.mark.slow  # two tiny trainings and four nights of the retraining flow: about 2 minutes on 2 cores
def test_a_scheduled_pipeline_is_promoted_when_pickscore_holds_and_held_when_it_falls(
    prefect_harness, tiny_pipeline, tmp_path: Path
) -> None:
    from flowpost.flows.retrain import retrain_flow

    build_tiny_clip(tmp_path / "clip")
    (tmp_path / "drawbench.csv").write_text(PROMPTS)
    workspace, pipeline_file = tmp_path / "ws", tmp_path / "nightly.yaml"
    configs = {steps: _nightly(tiny_pipeline, tmp_path, steps) for steps in (2, 3)}
    scores = {}
    for steps, config in configs.items():
        run = PipelineRun(validate_pipeline(config), workspace)
        nodes = list(run.nodes)
        for node in nodes[: nodes.index("eval.sft") + 1]:
            run.execute(node)
        result = json.loads((run.path("eval.sft") / "metrics.json").read_text())
        assert set(result["per_category"][GATE]) == {"colors", "counting"}  # DrawBench's categories
        scores[steps] = result[GATE]
    assert scores[2] != scores[3], scores
    worse, better = sorted(scores, key=scores.__getitem__)

    def night(steps: int, **gate: Any) -> dict[str, Any]:
        config = copy.deepcopy(configs[steps])
        config["export"]["promote"] |= gate
        pipeline_file.write_text(yaml.safe_dump(config, sort_keys=False))
        results = {r.node: r for r in retrain_flow(str(pipeline_file), [], str(workspace))}
        assert results["eval.sft"].status == "cached"  # scored above: the same numbers decide
        return json.loads((results["promote"].path / "promotion.json").read_text())

    first = night(worse)
    assert first["promoted"] and first["reason"] == "promoted: nothing was promoted before"
    second = night(better)
    assert second["promoted"], second
    assert (
        second["reason"] == f"promoted: no metric regressed ({GATE} {scores[better]:.3f}, promoted {scores[worse]:.3f})"
    )
    third = night(worse)
    assert not third["promoted"], third
    gap = scores[better] - scores[worse]
    assert third["reason"] == (
        f"kept the promoted export: {GATE} {scores[worse]:.3f} < {scores[better]:.3f} (promoted), worse by {gap:.3f}"
    )
    tolerated = night(worse, tolerance=gap * 1.01)  # a fall within the tolerance is no regression
    assert tolerated["promoted"], tolerated
    report = (workspace / "report.md").read_text()
    assert f"| sft | {GATE} | counting |" in report  # the per-category means
    promoted = json.loads((workspace / "promoted.json").read_text())
    assert promoted["metrics"][GATE] == scores[worse]
