"""The cost ledgers of the trained stages, as the training nodes left them beside the final weights, compared.

``reward_gained`` of a stage is its evaluation's ``reward_mean`` minus that of the stage reported before it
(``evaluate.after`` order), when both have one; ``seconds_per_reward_gained`` is the stage's wall seconds
divided by a positive gain (absent when the reward did not rise).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowpost.core.io import read_json
from flowpost.core.ledger import COST_FILE, PHASES

REWARD = "reward_mean"  # the evaluation metric a stage's gain is measured in


def read_cost(train_dir: Path) -> dict[str, Any] | None:
    """``final/cost.json`` of a training node's folder (None when it wrote none)."""
    path = train_dir / "final" / COST_FILE
    return read_json(path, what="cost ledger") if path.is_file() else None


def with_reward_gains(metrics: dict[str, dict[str, Any]]) -> None:
    """Add ``reward_gained`` and ``seconds_per_reward_gained`` to each stage's ``cost`` where defined."""
    previous: float | None = None
    for m in metrics.values():
        reward = m.get(REWARD)
        cost = m.get("cost")
        if cost is not None and reward is not None and previous is not None:
            gained = float(reward) - previous
            cost["reward_gained"] = gained
            if gained > 0:
                cost["seconds_per_reward_gained"] = cost["wall_seconds"] / gained
        previous = float(reward) if reward is not None else None


def cost_rows(metrics: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per stage with a ledger: wall seconds per phase, throughput, peak memory, cost of its gain."""
    costs = {stage: m["cost"] for stage, m in metrics.items() if "cost" in m}
    seen = {name for cost in costs.values() for name in cost["phases"]}
    phases = [name for name in [*PHASES, *sorted(seen - set(PHASES))] if name in seen]
    rows = []
    for stage, cost in costs.items():
        rate = next((key for key in cost if key.endswith("_per_gpu_per_second")), None)
        row: dict[str, Any] = {"stage": stage, "wall_s": round(cost["wall_seconds"], 3)}
        row |= {f"{name}_s": round(cost["phases"].get(name, 0.0), 3) for name in phases}
        row |= {
            "other_s": round(cost["other_seconds"], 3),
            "samples_per_s": round(cost["samples_per_second"], 3),
            "per_gpu_per_s": f"{cost[rate]:.4g} {rate.split('_')[0]}" if rate else "",
            "peak_memory_mib": round(cost["peak_memory_bytes"] / 2**20, 1),
            "memory_kind": cost["memory_kind"],
            "reward_gained": round(cost["reward_gained"], 6) if "reward_gained" in cost else "",
            "s_per_reward_gained": round(cost["seconds_per_reward_gained"], 3)
            if "seconds_per_reward_gained" in cost
            else "",
        }
        rows.append(row)
    return rows


def cost_table(metrics: dict[str, dict[str, Any]]) -> list[str]:
    """The markdown table of ``cost_rows`` (no lines when no stage has a ledger)."""
    rows = cost_rows(metrics)
    if not rows:
        return []
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(row[key]) for key in header) + " |" for row in rows]
    return lines
