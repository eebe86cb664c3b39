"""The replay-width and reward-overlap benchmark: its four arms run the same work, and it says when they do not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import grpo_overlap as bench  # noqa: E402


def _run(loss: float, reward: float) -> dict:
    return {"first": {"loss": loss, "reward/total_mean": reward}}


def test_arms_that_did_not_do_the_same_work_are_refused() -> None:
    same = {"default": [_run(0.25, 1.5)], "auto": [_run(0.25 + 1e-9, 1.5)]}
    bench.check_equal_work(same)
    with pytest.raises(RuntimeError, match="auto: first reward mean"):
        bench.check_equal_work({**same, "auto": [_run(0.25, 1.4)]})
    with pytest.raises(RuntimeError, match="overlap: first loss"):
        bench.check_equal_work({**same, "overlap": [_run(0.3, 1.5)]})


@pytest.mark.slow
def test_one_round_of_the_four_arms_measures_each(tmp_path: Path) -> None:
    assert bench.main(["--workspace", str(tmp_path), "--rounds", "1", "--iterations", "2"]) == 0
    medians = json.loads((tmp_path / "grpo_overlap.json").read_text())["medians"]
    assert {arm: row["steps_per_pass"] for arm, row in medians.items()} == {
        "default": 4,
        "auto": 1,
        "overlap": 4,
        "both": 1,
    }
    assert medians["auto"]["peak_rss_growth_mib"] < medians["default"]["peak_rss_growth_mib"]
    assert all(row["iteration_s"] > 0 and row["cpu_s"] > 0 for row in medians.values())
