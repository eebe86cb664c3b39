"""``eval.<stage>`` over several seeds on a trained tiny stage: per-seed values, their mean and interval,
the trained reward's gap to the headline metric, and the report with its embedded sample grid."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import pytest

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.config.schema import MetricConfig, RewardConfig
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.evaluate import evaluate_stage
from flowpost.tasks.report import write_report
from flowpost.tasks.runner import PipelineRun

T_975_ONE_DF = 12.706204736  # two seeds: t(0.975, 1)
METRICS = ["brightness", "jpeg_incompressibility", "adherence"]


@pytest.fixture(scope="module")
def evaluations(completed_workspace: tuple[Path, dict[str, str]], tiny_pipeline, tmp_path_factory) -> dict[str, Any]:
    """Seeds 5 and 6 together and each alone, the stage scored as if trained on jpeg_compressibility."""
    workspace, _ = completed_workspace
    run = PipelineRun(validate_pipeline(tiny_pipeline()), workspace)
    out = tmp_path_factory.mktemp("evaluations")
    conditions = run.path("conditions.minilm")
    metrics = [MetricConfig.model_validate(name) for name in METRICS]

    def evaluate(seeds: list[int], folder: str) -> dict[str, Any]:
        config = run.pipeline.evaluate.model_copy(update={"seeds": seeds, "metrics": metrics})
        return evaluate_stage(
            config,
            stage="sft",
            rewards=[RewardConfig(name="jpeg_compressibility")],
            train_dir=run.path("train.sft"),
            dataset_dir=run.path("acquire.digits"),
            conditions_dir=conditions,
            encoder_fingerprint=encoder_fingerprint(conditions),
            out_dir=out / folder,
            seed=0,
            smoke=True,
        )

    return {"both": evaluate([5, 6], "both"), 5: evaluate([5], "five"), 6: evaluate([6], "six"), "out": out}


def test_several_seeds_give_each_seeds_values_their_mean_and_a_95_percent_interval(evaluations) -> None:
    both, alone = evaluations["both"], [evaluations[5], evaluations[6]]
    assert both["eval_seeds"] == [5, 6] and both["n_samples"] == 40 and both["samples_per_seed"] == 20
    assert [row["seed"] for row in both["per_seed"]] == [5, 6]
    for key in [*METRICS, "trained_reward"]:
        values = [single[key] for single in alone]
        assert [row[key] for row in both["per_seed"]] == values  # a seed's samples do not depend on the others
        mean = (values[0] + values[1]) / 2
        half = T_975_ONE_DF * abs(values[0] - values[1]) / math.sqrt(2) / math.sqrt(2)
        assert both[key] == pytest.approx(mean)
        assert both["intervals"][key] == pytest.approx([mean - half, mean + half])
    assert alone[0]["brightness"] != alone[1]["brightness"]  # the seeds draw different samples
    assert "intervals" not in alone[0] and "per_seed" not in alone[0]


def test_the_trained_reward_and_its_gap_to_the_headline_metric(evaluations) -> None:
    for result in (evaluations["both"], evaluations[5]):
        assert result["headline"] == "brightness" and result["metrics"] == METRICS
        assert result["trained_reward"] == pytest.approx(-result["jpeg_incompressibility"])  # its negation
        assert result["reward_judge_gap"] == pytest.approx(result["trained_reward"] - result["brightness"])


def test_the_report_embeds_the_grid_and_shows_intervals_and_the_gap(evaluations) -> None:
    out: Path = evaluations["out"]
    metrics = write_report(name="tiny", eval_dirs={"sft": out / "both"}, export_dir=None, out_dirs=[out])
    assert set(metrics["sft"]) == {*METRICS, "trained_reward", "reward_judge_gap", "intervals"} | {
        "n_samples",
        "step",
        "weights",
        "seed",
        "smoke",
    }
    assert json.loads((out / "metrics.json").read_text()) == metrics
    report = (out / "report.md").read_text()
    header = "| stage | brightness | jpeg_incompressibility | adherence | trained_reward | reward_judge_gap |"
    assert header in report
    low, high = metrics["sft"]["intervals"]["brightness"]
    assert f"{metrics['sft']['brightness']:.4g} [{low:.4g}, {high:.4g}]" in report
    assert "headline metric (sft: `brightness`)" in report
    embedded = report.split("(data:image/png;base64,", 1)[1].split(")", 1)[0]
    assert base64.b64decode(embedded) == (out / "both" / "grid.png").read_bytes()
