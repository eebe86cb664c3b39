"""The trade-off between two evaluated metrics over scored checkpoints: the Pareto front under each metric's
direction, the pairs plotted, and the report section with its PNGs."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from flowpost.tasks.pareto import Checkpoint, checkpoints, metric_pairs, pareto_front, trade_off_section

CURVES = {
    "sft": [
        {"step": 10, "adherence": 0.5, "fd": 80.0, "blur": 1.0},
        {"step": 20, "adherence": 0.7, "fd": 75.0, "blur": 2.0},
    ],
    "grpo": [
        {"step": 4, "adherence": 0.9, "fd": 90.0, "blur": 3.0},
        {"step": 8, "adherence": 0.8, "fd": 70.0, "blur": 4.0},
    ],
}


def test_the_front_keeps_the_points_no_other_beats_on_both_in_each_metric_s_direction() -> None:
    points = checkpoints(CURVES, "adherence", "fd")
    assert [(p.stage, p.step) for p in points] == [("sft", 10), ("sft", 20), ("grpo", 4), ("grpo", 8)]
    # fd lower is better: sft@20 (0.7, 75) is beaten by grpo@8 (0.8, 70); grpo@4 has the best adherence
    assert pareto_front(points, ("higher", "lower")) == [False, False, True, True]
    # were fd better high, grpo@4 (0.9, 90) would beat every other point
    assert pareto_front(points, ("higher", "higher")) == [False, False, True, False]
    ties = [Checkpoint("a", 1, 1.0, 1.0), Checkpoint("a", 2, 1.0, 1.0)]
    assert pareto_front(ties, ("higher", "higher")) == [True, True]  # equal points do not dominate each other


def test_pairs_come_from_the_first_three_metrics_with_a_direction() -> None:
    assert metric_pairs(CURVES, {"adherence": "higher", "fd": "lower", "blur": "lower"}) == [
        ("adherence", "fd"),
        ("adherence", "blur"),
        ("fd", "blur"),
    ]
    assert metric_pairs(CURVES, {"adherence": "higher"}) == []  # one metric with a direction: no trade-off


def test_the_report_section_writes_and_embeds_one_plot_per_pair(tmp_path: Path) -> None:
    lines = trade_off_section(CURVES, {"adherence": "higher", "fd": "lower"}, [tmp_path])
    text = "\n".join(lines)
    assert "## Trade-offs over checkpoints" in text
    assert "grpo step 4 (0.9, 90), grpo step 8 (0.8, 70)" in text and "sft step" not in text
    plot = Image.open(io.BytesIO((tmp_path / "pareto-adherence-fd.png").read_bytes()))
    assert plot.size == (560, 400) and len(set(plot.getdata())) > 3  # axes, curves and labels drawn in colours
    assert "data:image/png;base64," in text
    assert trade_off_section(CURVES, {"fd": "lower"}, [tmp_path]) == []
