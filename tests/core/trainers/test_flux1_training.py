"""The real trainers on the flux1 family (a tiny random FLUX.1-dev folder) with its own encoded conditions."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_flux1_pipeline import load_flux1_adapter

from flowpost.core.diagnostics import check_consistency
from flowpost.core.trainers.rl.grpo import GRPOTrainer

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}


def test_one_sft_step_trains_the_transformer(make_trainer, tmp_path, flux1_pipeline_dir: Path, flux1_data_dirs) -> None:
    adapter = load_flux1_adapter(flux1_pipeline_dir)
    before = {k: v.clone() for k, v in adapter.module().state_dict().items()}
    trainer = make_trainer(tmp_path, adapter=adapter, dirs=flux1_data_dirs, max_steps=1)
    progress = trainer.start()
    assert progress.optimizer_step == 1
    assert any(not torch.equal(before[k], v) for k, v in adapter.module().state_dict().items())


def test_one_grpo_iteration_with_lora(make_trainer, tmp_path, flux1_pipeline_dir: Path, flux1_data_dirs) -> None:
    adapter = load_flux1_adapter(flux1_pipeline_dir)
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        adapter=adapter,
        dirs=flux1_data_dirs,
        lora_rank=4,
        rewards=JPEG,
        sampling={"steps": 4},
        iterations=1,
        **SMALL,
    )
    lora = {k: v.clone() for k, v in adapter.module().state_dict().items() if "lora_B" in k}
    progress = trainer.start()
    assert (progress.rollout_iteration, progress.optimizer_step) == (1, 2)
    after = adapter.module().state_dict()
    assert any(not torch.equal(after[k], v) for k, v in lora.items())


def test_replay_reproduces_the_rollout_log_probs(make_trainer, tmp_path, flux1_pipeline_dir: Path, flux1_data_dirs):
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        adapter=load_flux1_adapter(flux1_pipeline_dir),
        dirs=flux1_data_dirs,
        rewards=JPEG,
        sampling={"steps": 5, "window": 2},
        **SMALL,
    )
    report = check_consistency(trainer)
    assert report["ok"] and report["max_abs_ratio_error"] < 1e-5
