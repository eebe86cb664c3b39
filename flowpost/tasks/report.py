"""Node ``report``: gather evaluation results into ``metrics.json`` and ``report.md``."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from flowpost.core.evaluation.samples import Better
from flowpost.core.io import read_json, write_bytes_atomic, write_json_atomic
from flowpost.tasks.cost import REWARD, cost_table, read_cost, with_reward_gains
from flowpost.tasks.curve import CURVE_FILE, read_curve
from flowpost.tasks.evaluate import GAP, TRAINED_REWARD
from flowpost.tasks.guard_record import describe_guard, guard_outcome, read_guard_record
from flowpost.tasks.pareto import trade_off_section
from flowpost.tasks.promote import DECISION_FILE

RUN_FIELDS = ("n_samples", "step", "weights", "seed", "smoke")
GAP_FIELDS = (TRAINED_REWARD, GAP)
GUARD_FIELDS = ("fired", "checks", "at", "at_iteration", "ended_with", "ended_with_iteration")  # in metrics.json
CARRIED = ("intervals", "per_category", "base", "vs_base")  # an evaluation's fields the report keeps when present
NOT_COLUMNS = (*RUN_FIELDS, *CARRIED, "guard", "cost")  # a stage's fields that are no metric column


def write_report(
    *,
    name: str,
    eval_dirs: dict[str, Path],
    export_dir: Path | None,
    out_dirs: list[Path],
    promotion_dir: Path | None = None,
    guard_dirs: dict[str, Path] | None = None,
    train_dirs: dict[str, Path] | None = None,
    directions: dict[str, Better] | None = None,
) -> dict[str, Any]:
    """``{stage: {<each metric>, [trained_reward, reward_judge_gap], n_samples, step, weights, seed, smoke,
    [intervals], [per_category], [base, vs_base], [guard: {fired, checks, at, ended_with (steps)}], [cost: {...}]}}``
    to each out dir
    (``cost``: the stage's cost ledger from ``train_dirs``, stage -> training folder, with its reward gain:
    ``flowpost.tasks.cost``); report.md adds the table comparing the stages' costs, what the guards of
    ``guard_dirs`` (stage -> training folder) decided, each stage's checkpoint curve (``evaluate.every``),
    the trade-off between each pair of metrics with a ``directions`` entry across those checkpoints (Pareto
    plots, ``flowpost.tasks.pareto``), the sample grids (embedded), the export and the promotion gate's
    decision."""
    metrics: dict[str, Any] = {}
    headlines: dict[str, str] = {}
    for stage, directory in eval_dirs.items():
        result = read_json(directory / "metrics.json", what=f"evaluation of stage {stage}")
        keys = [*result["metrics"], *(k for k in GAP_FIELDS if k in result), *RUN_FIELDS]
        metrics[stage] = {key: result[key] for key in keys}
        metrics[stage] |= {key: result[key] for key in CARRIED if key in result}
        headlines[stage] = result["headline"]
    records = {stage: read_guard_record(directory) for stage, directory in (guard_dirs or {}).items()}
    guards = {stage: guard_outcome(record) for stage, record in records.items() if record is not None}
    for stage, outcome in guards.items():
        if stage in metrics:
            metrics[stage]["guard"] = {key: outcome[key] for key in GUARD_FIELDS if key in outcome}
    for stage, directory in (train_dirs or {}).items():
        if stage in metrics and (cost := read_cost(directory)) is not None:
            metrics[stage]["cost"] = cost
    with_reward_gains(metrics)
    lines = [f"# {name}", "", *_table(metrics)]
    if costs := cost_table(metrics):
        lines += [
            "",
            "## Cost",
            "",
            *costs,
            "",
            "Wall seconds per phase of each training stage (`other`: what no phase covers: resume, events, "
            "callbacks), samples per second over the stage's wall time, media per GPU per second (divided by "
            "the ranks), and the peak memory (the maximum over ranks). `reward_gained` is the stage's "
            f"`{REWARD}` minus the stage's above it; `s_per_reward_gained` its wall seconds per unit gained.",
        ]
    if compared := _base_table(metrics):
        lines += [
            "",
            "## Against the base model",
            "",
            *compared,
            "",
            "Each stage and its base model (what the first stage of its init chain starts from) sampled with the "
            "same prompts and noise; the difference is the stage minus the base, with its 95 % interval over the "
            "paired samples (a metric scoring each sample) or seeds.",
        ]
    categories = [
        f"| {stage} | {key} | {category} | {value:.4g} |"
        for stage, m in metrics.items()
        for key, means in m.get("per_category", {}).items()
        for category, value in means.items()
    ]
    if categories:
        lines += ["", "## Per prompt category", "", "| stage | metric | category | mean |", "|" + " --- |" * 4]
        lines += categories
    if guards:
        lines += ["", "## Guards", "", *(f"- {describe_guard(stage, o)}" for stage, o in guards.items())]
    if any(GAP in m for m in metrics.values()):
        lines += [
            "",
            "`trained_reward` is the stage's own reward on the evaluation samples; `reward_judge_gap` is it "
            "minus the headline metric ("
            + ", ".join(f"{stage}: `{headlines[stage]}`" for stage, m in metrics.items() if GAP in m)
            + "). A gap that grows from stage to stage is a reward being learnt rather than the task.",
        ]
    curves = {stage: curve for stage, directory in eval_dirs.items() if (curve := read_curve(directory)) is not None}
    for stage, curve in curves.items():
        lines += ["", f"## {stage} over checkpoints (`{eval_dirs[stage] / CURVE_FILE}`)", "", *_curve_table(curve)]
    lines += trade_off_section(curves, directions or {}, out_dirs)
    if any("intervals" in m for m in metrics.values()):
        lines += ["", "Values are means over the evaluation seeds, with their 95 % interval in brackets."]
    lines += ["", "Sample grids (one row per digit or prompt, held-out prompts):", ""]
    for stage, directory in eval_dirs.items():
        grid = directory / "grid.png"
        data = base64.b64encode(grid.read_bytes()).decode("ascii")
        lines += [f"- {stage}: `{grid}`", "", f"  ![{stage} samples](data:image/png;base64,{data})", ""]
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


def _table(metrics: dict[str, Any]) -> list[str]:
    """One row per stage, one column per metric any stage reports (headline first)."""
    columns: list[str] = []
    for m in metrics.values():
        columns += [key for key in m if key not in NOT_COLUMNS and key not in columns]
    header = ["stage", *columns, "samples", "step", "weights", "smoke"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for stage, m in metrics.items():
        cells = [_cell(m, key) for key in columns]
        lines.append(
            "| "
            + " | ".join([stage, *cells, str(m["n_samples"]), str(m["step"]), m["weights"], str(m["smoke"])])
            + " |"
        )
    return lines


def _base_table(metrics: dict[str, Any]) -> list[str]:
    """One row per evaluated stage and metric compared with its base model; none without comparisons."""
    rows = [
        f"| {stage} | {key} | {m['base'][key]:.4g} | {m[key]:.4g} | {_difference(entry)} | {entry['paired']} |"
        for stage, m in metrics.items()
        for key, entry in m.get("vs_base", {}).items()
    ]
    if not rows:
        return []
    return ["| stage | metric | base | stage value | difference [95 %] | paired over |", "|" + " --- |" * 6, *rows]


def _difference(entry: dict[str, Any]) -> str:
    text = f"{entry['difference']:+.4g}"
    interval = entry.get("interval")
    return f"{text} [{interval[0]:+.4g}, {interval[1]:+.4g}]" if interval else text


def _curve_table(curve: list[dict[str, Any]]) -> list[str]:
    """One row per scored step, one column per metric (means over the seeds)."""
    columns = [key for key in curve[0] if key != "step"]
    lines = ["| " + " | ".join(["step", *columns]) + " |", "|" + " --- |" * (len(columns) + 1)]
    lines += ["| " + " | ".join([str(row["step"]), *(f"{row[key]:.4g}" for key in columns)]) + " |" for row in curve]
    return lines


def _cell(m: dict[str, Any], key: str) -> str:
    if key not in m:
        return ""
    interval = m.get("intervals", {}).get(key)
    text = f"{m[key]:.4g}"
    return f"{text} [{interval[0]:.4g}, {interval[1]:.4g}]" if interval else text
