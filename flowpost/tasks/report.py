"""Node ``report``: gather evaluation results into ``metrics.json`` and ``report.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowpost.core.io import read_json, write_bytes_atomic, write_json_atomic
from flowpost.tasks.promote import DECISION_FILE

REPORTED = ("adherence", "reward_mean", "fd", "n_samples", "step", "weights", "seed", "smoke")


def write_report(
    *,
    name: str,
    eval_dirs: dict[str, Path],
    export_dir: Path | None,
    out_dirs: list[Path],
    promotion_dir: Path | None = None,
) -> dict[str, Any]:
    """``{stage: {adherence, reward_mean, fd, n_samples, step, weights, seed, smoke}}`` to each out dir;
    report.md also names the export and the promotion gate's decision."""
    metrics: dict[str, Any] = {}
    grids: dict[str, str] = {}
    for stage, directory in eval_dirs.items():
        result = read_json(directory / "metrics.json", what=f"evaluation of stage {stage}")
        metrics[stage] = {key: result[key] for key in REPORTED}
        grids[stage] = str(directory / "grid.png")
    lines = [
        f"# {name}",
        "",
        "| stage | adherence | reward_mean | fd | samples | step | weights | smoke |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for stage, m in metrics.items():
        lines.append(
            f"| {stage} | {m['adherence']:.3f} | {m['reward_mean']:.3f} | {m['fd']:.2f} | {m['n_samples']} "
            f"| {m['step']} | {m['weights']} | {m['smoke']} |"
        )
    lines += ["", "Sample grids (one row per digit, held-out prompt templates):", ""]
    lines += [f"- {stage}: `{path}`" for stage, path in grids.items()]
    if export_dir is not None:
        lines += ["", f"Export: `{export_dir}`"]
    if promotion_dir is not None:
        decision = read_json(promotion_dir / DECISION_FILE, what="promotion decision")
        lines += ["", f"Promotion: {decision['reason']}"]  # the reason states the decision
    text = "\n".join(lines) + "\n"
    for directory in out_dirs:
        write_json_atomic(directory / "metrics.json", metrics)
        write_bytes_atomic(directory / "report.md", text.encode())
    return metrics
