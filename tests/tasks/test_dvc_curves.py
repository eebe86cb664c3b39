"""``flowpost dvc sync`` with ``evaluate.every``: a plot per stage and metric, and eval stages that
depend on the checkpoints they score; without it the DVC files are as before."""

from __future__ import annotations

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.dvc import dvc_stages


def test_each_metric_of_each_curve_is_a_plot_over_step(tiny_pipeline) -> None:
    data = tiny_pipeline(checkpoint_every=1)
    data["evaluate"] = {**data["evaluate"], "every": 2, "metrics": ["brightness", {"name": "fd", "key": "judge_fd"}]}
    stages = dvc_stages(validate_pipeline(data))
    curve = "workspace/eval/sft/curve.json"
    assert stages["plots"] == [
        {"sft-brightness": {"x": "step", "y": {curve: "brightness"}, "title": "sft: brightness over checkpoints"}},
        {"sft-judge_fd": {"x": "step", "y": {curve: "judge_fd"}, "title": "sft: judge_fd over checkpoints"}},
    ]
    evaluation = stages["stages"]["eval.sft"]
    assert evaluation["deps"][-1] == "workspace/stages/sft/checkpoints" and "evaluate.every" in evaluation["params"]
    assert evaluation["outs"] == ["workspace/eval/sft"]  # the curve lies inside it: a plot, not an out


def test_without_every_there_are_no_plots_and_no_checkpoint_deps(tiny_pipeline) -> None:
    stages = dvc_stages(validate_pipeline(tiny_pipeline()))
    assert "plots" not in stages
    assert "workspace/stages/sft/checkpoints" not in stages["stages"]["eval.sft"]["deps"]
    assert "evaluate.every" not in stages["stages"]["eval.sft"]["params"]
