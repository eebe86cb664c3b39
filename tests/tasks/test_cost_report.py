"""The cost table of the report: reward gains between consecutive stages and the cost of each unit gained."""

from __future__ import annotations

from flowpost.tasks.cost import cost_rows, cost_table, with_reward_gains


def _cost(wall: float, **phases: float) -> dict:
    return {
        "wall_seconds": wall,
        "phases": phases,
        "other_seconds": wall - sum(phases.values()),
        "samples": 8,
        "samples_per_second": 8 / wall,
        "images_per_gpu_per_second": 4 / wall,
        "peak_memory_bytes": 3 * 2**20,
        "memory_kind": "cuda_max_allocated",
    }


def test_a_stage_s_gain_is_its_reward_minus_the_stage_above_and_only_a_rise_has_a_price():
    metrics = {
        "sft": {"reward_mean": 0.5, "cost": _cost(10.0, data=2.0, optimize=7.0)},
        "grpo": {"reward_mean": 0.75, "cost": _cost(20.0, rollout=10.0, reward=2.0, optimize=6.0)},
        "worse": {"reward_mean": 0.7, "cost": _cost(5.0, rollout=4.0)},
        "unjudged": {"cost": _cost(5.0, rollout=4.0)},
    }
    with_reward_gains(metrics)
    assert "reward_gained" not in metrics["sft"]["cost"]
    assert metrics["grpo"]["cost"]["reward_gained"] == 0.25
    assert metrics["grpo"]["cost"]["seconds_per_reward_gained"] == 80.0
    assert metrics["worse"]["cost"]["reward_gained"] < 0 and "seconds_per_reward_gained" not in metrics["worse"]["cost"]
    assert "reward_gained" not in metrics["unjudged"]["cost"]
    rows = cost_rows(metrics)
    assert list(rows[0])[:7] == ["stage", "wall_s", "rollout_s", "reward_s", "data_s", "optimize_s", "other_s"]
    assert rows[0]["rollout_s"] == 0.0 and rows[1]["rollout_s"] == 10.0 and rows[1]["s_per_reward_gained"] == 80.0
    assert rows[1]["peak_memory_mib"] == 3.0 and rows[1]["per_gpu_per_s"] == "0.2 images"
    assert cost_table(metrics)[2].startswith("| sft | 10.0 |") and cost_table({"sft": {}}) == []
