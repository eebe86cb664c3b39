"""The real trainers on the wan2 family (a tiny random text-to-video folder): clips, sampled-frame rewards."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_wan2_pipeline import load_wan2_adapter

from flowpost.core.diagnostics import check_consistency
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.core.trainers.rl.nft import NFTTrainer

SAMPLED_JPEG = [{"name": "jpeg_incompressibility", "frames": "sampled", "sampled_frames": 3}]
SMALL = {"prompts_per_iteration": 2, "group_size": 2, "rollout_batch_size": 4, "train_batch_size": 2}


def _changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_one_sft_step_on_clips_trains_the_transformer(make_trainer, tmp_path, wan2_pipeline_dir, wan2_data_dirs):
    adapter = load_wan2_adapter(wan2_pipeline_dir)
    before = {k: v.clone() for k, v in adapter.module().state_dict().items()}
    trainer = make_trainer(tmp_path, adapter=adapter, dirs=wan2_data_dirs, max_steps=1, batch_size=2)
    assert trainer.start().optimizer_step == 1
    assert _changed(before, adapter.module())


def test_one_grpo_iteration_scores_sampled_frames(make_trainer, tmp_path, wan2_pipeline_dir, wan2_data_dirs) -> None:
    adapter = load_wan2_adapter(wan2_pipeline_dir)
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        adapter=adapter,
        dirs=wan2_data_dirs,
        lora_rank=4,
        rewards=SAMPLED_JPEG,
        sampling={"steps": 3, "guidance": 5.0},
        iterations=1,
        **SMALL,
    )
    lora = {k: v.clone() for k, v in adapter.module().state_dict().items() if "lora_B" in k}
    progress = trainer.start()
    assert (progress.rollout_iteration, progress.optimizer_step) == (1, 2)
    after = adapter.module().state_dict()
    assert any(not torch.equal(after[k], v) for k, v in lora.items())


def test_one_nft_iteration_trains_the_lora(make_trainer, tmp_path, wan2_pipeline_dir: Path, wan2_data_dirs) -> None:
    adapter = load_wan2_adapter(wan2_pipeline_dir)
    trainer = make_trainer(
        tmp_path,
        cls=NFTTrainer,
        adapter=adapter,
        dirs=wan2_data_dirs,
        lora_rank=4,
        rewards=[{"name": "jpeg_compressibility", "frames": "first"}],
        sampling={"steps": 3},
        iterations=1,
        **SMALL,
    )
    lora = {k: v.clone() for k, v in adapter.module().state_dict().items() if "lora_B" in k}
    assert trainer.start().rollout_iteration == 1
    after = adapter.module().state_dict()
    assert any(not torch.equal(after[k], v) for k, v in lora.items())


def test_replay_reproduces_the_rollout_log_probs(make_trainer, tmp_path, wan2_pipeline_dir, wan2_data_dirs) -> None:
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        adapter=load_wan2_adapter(wan2_pipeline_dir),
        dirs=wan2_data_dirs,
        rewards=SAMPLED_JPEG,
        sampling={"steps": 4, "window": 2, "guidance": 5.0},
        **SMALL,
    )
    report = check_consistency(trainer)
    assert report["ok"] and report["max_abs_ratio_error"] < 1e-5
