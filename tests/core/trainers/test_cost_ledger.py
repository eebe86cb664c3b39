"""The cost ledger: disjoint phases within the stage's wall time, throughput, peak memory, cumulative on resume."""

from __future__ import annotations

import time

import pytest
import torch

from flowpost.core.checkpoint import latest_checkpoint, load_checkpoint
from flowpost.core.io import read_json
from flowpost.core.ledger import COST_FILE, CPU_MEMORY, CostLedger
from flowpost.core.trainers.rl.grpo import GRPOTrainer

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {"prompts_per_iteration": 2, "group_size": 2, "rollout_batch_size": 4, "train_batch_size": 4}


def _cost(out) -> dict:  # noqa: ANN001
    return read_json(out / "final" / COST_FILE)


def _check_phases(cost: dict, phases: set[str]) -> None:
    assert set(cost["phases"]) == phases and all(seconds > 0 for seconds in cost["phases"].values())
    assert sum(cost["phases"].values()) <= cost["wall_seconds"]
    assert cost["other_seconds"] == pytest.approx(cost["wall_seconds"] - sum(cost["phases"].values()))


def test_a_grpo_stage_records_rollout_reward_and_optimize_time(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=GRPOTrainer, rewards=JPEG, sampling={"steps": 2}, iterations=2, **SMALL)
    trainer.start()
    cost = _cost(tmp_path)
    _check_phases(cost, {"rollout", "reward", "optimize", "checkpoint"})
    assert (cost["samples"], cost["sample_kind"], cost["world_size"], cost["runs"]) == (8, "generated", 1, 1)
    assert cost["samples_per_second"] == pytest.approx(8 / cost["wall_seconds"])
    assert cost["images_per_gpu_per_second"] == pytest.approx(cost["samples_per_second"])
    assert cost["memory_kind"] == CPU_MEMORY and cost["peak_memory_bytes"] > 2**20


def test_an_sft_stage_records_data_and_optimize_time_and_resumes_cumulatively(make_trainer, tmp_path):
    first = make_trainer(tmp_path, max_steps=2, checkpoint_every=1, gradient_accumulation_steps=2)
    first.start()
    cost = _cost(tmp_path)
    _check_phases(cost, {"data", "optimize", "checkpoint"})
    assert (cost["samples"], cost["sample_kind"], cost["runs"]) == (16, "training examples", 1)
    saved = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints")).trainer["ledger"]
    assert saved["samples"] == 16 and 0 < saved["wall_seconds"] <= cost["wall_seconds"]

    resumed = make_trainer(tmp_path, max_steps=3, checkpoint_every=1, gradient_accumulation_steps=2)
    resumed.start()
    total = _cost(tmp_path)
    assert (total["samples"], total["runs"]) == (24, 2)
    assert total["wall_seconds"] > saved["wall_seconds"]
    assert all(total["phases"][name] >= saved["seconds"][name] for name in saved["seconds"])
    _check_phases(total, {"data", "optimize", "checkpoint"})


def test_nested_phases_are_disjoint_and_an_open_phase_counts_in_a_checkpoint():
    ledger = CostLedger(torch.device("cpu"))
    ledger.start()
    with ledger.phase("optimize"):
        time.sleep(0.02)
        with ledger.phase("evaluation"):
            time.sleep(0.03)
        time.sleep(0.02)
        state = ledger.state_dict()
    assert state["seconds"]["evaluation"] >= 0.03 and state["seconds"]["optimize"] >= 0.04 - 1e-3
    assert ledger.seconds["optimize"] < 0.04 + 0.03  # the evaluation's time is not the optimizer's
    assert sum(ledger.seconds.values()) <= ledger.wall_seconds()
    again = CostLedger(torch.device("cpu"))
    again.load_state_dict(state)
    again.start()
    assert again.runs == 2 and again.wall_seconds() >= state["wall_seconds"]


def test_only_the_iteration_phases_wait_for_the_device_never_a_micro_batch(make_trainer, tmp_path, monkeypatch):
    synced: list[bool] = []
    now = CostLedger._now
    monkeypatch.setattr(CostLedger, "_now", lambda self, sync: synced.append(sync) or now(self, sync))
    grpo = make_trainer(tmp_path / "grpo", cls=GRPOTrainer, rewards=JPEG, sampling={"steps": 2}, **SMALL)
    grpo._run_cycles(1)
    assert grpo.progress.optimizer_step == 1 and synced == [True] * 6  # rollout, reward, optimize: two each
    synced.clear()
    sft = make_trainer(tmp_path / "sft", max_steps=2, gradient_accumulation_steps=2)
    sft._run_cycles(sft.budget)
    assert len(synced) > 0 and not any(synced)  # data and optimize time the host
