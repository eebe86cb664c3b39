"""``bench/run_all.py --render`` writes the results of an earlier run under that run's own stamp."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import run_all  # noqa: E402


def _family(flowpost_s: float, bare_s: float) -> dict:
    ratio = flowpost_s / bare_s
    return {
        "unit": "step",
        "flowpost_median_s": flowpost_s,
        "bare_median_s": bare_s,
        "ratio": ratio,
        "units": 44,
        "cpu_ratio": ratio,
        "first_loss": {"flowpost": 1.5, "bare": 1.5},
        "batch_size": 8,
        "threads": 1,
    }


def test_render_keeps_the_measuring_runs_stamp_and_shows_what_flowpost_adds(tmp_path: Path) -> None:
    stamp = "2026-01-01 03:00 UTC, commit abc1234, 2 CPU cores, load average 0.1, 0.1, 0.1 at the end"
    (tmp_path / "run_all.json").write_text(json.dumps({"seconds": {"family_step": 8.0}, "machine": stamp}))
    family = {"sd3": _family(0.0088, 0.0077), "wan2": _family(0.0322, 0.0311)}
    (tmp_path / "family_step.json").write_text(json.dumps(family))
    out = tmp_path / "results.md"
    assert run_all.main(["--render", "--workspace", str(tmp_path), "--out", str(out), "--only", "family_step"]) == 0
    text = out.read_text()
    assert f"Profile `full`, 8 s in all; {stamp}." in text
    assert (
        "| sd3 | 8.8 ms | 7.7 ms | 1.1 ms | 1.143 |" in text and "| wan2 | 32.2 ms | 31.1 ms | 1.1 ms | 1.035 |" in text
    )
    assert "What flowpost adds (1.1 ms per step here)" in text


def test_a_run_keeps_the_studies_written_below_its_sections(tmp_path: Path) -> None:
    (tmp_path / "family_step.json").write_text(json.dumps({"sd3": _family(0.0088, 0.0077)}))
    out = tmp_path / "results.md"
    study = f"{run_all.STUDIES}\n\n## A study\n\n`python bench/study.py` | 1 -> 2 |\n"
    out.write_text("# Benchmarks\n\nold figures\n\n" + study)
    for _ in range(2):
        assert run_all.main(["--render", "--workspace", str(tmp_path), "--out", str(out), "--only", "family_step"]) == 0
    text = out.read_text()
    assert "old figures" not in text and "| sd3 | 8.8 ms |" in text
    assert text.count(run_all.STUDIES) == 1 and text.endswith(study)
