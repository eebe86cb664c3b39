"""The real trainers on each family loaded from a tiny random pipeline folder, with its own encoded conditions."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pipeline_families import PIPELINE_FAMILIES

from flowpost.core.diagnostics import check_consistency
from flowpost.core.trainers.rl.awm import AWMTrainer
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.core.trainers.rl.nft import NFTTrainer

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}


@pytest.fixture(params=sorted(PIPELINE_FAMILIES))
def family(request: pytest.FixtureRequest, load_family) -> dict[str, Any]:
    """The family's freshly loaded adapter, its stage data and its rollout guidance."""
    return load_family(request.param)


def _changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(before[k], v) for k, v in module.state_dict().items() if k in before)


def test_one_sft_step_trains_the_transformer(make_trainer, tmp_path, family) -> None:
    adapter = family["adapter"]
    before = {k: v.clone() for k, v in adapter.module().state_dict().items()}
    trainer = make_trainer(tmp_path, adapter=adapter, dirs=family["dirs"], max_steps=1)
    assert trainer.start().optimizer_step == 1
    assert _changed(before, adapter.module())


@pytest.mark.parametrize("cls", [GRPOTrainer, NFTTrainer, AWMTrainer], ids=["grpo", "nft", "awm"])
def test_one_rollout_iteration_trains_the_lora(make_trainer, tmp_path, family, cls) -> None:
    adapter = family["adapter"]
    extra = {"train_timesteps": 2} if cls is AWMTrainer else {}
    trainer = make_trainer(
        tmp_path,
        cls=cls,
        adapter=adapter,
        dirs=family["dirs"],
        lora_rank=4,
        rewards=JPEG,
        sampling={"steps": 4, "guidance": family["guidance"]},
        iterations=1,
        **SMALL,
        **extra,
    )
    lora = {k: v.clone() for k, v in adapter.module().state_dict().items() if "lora_B" in k}
    progress = trainer.start()
    assert progress.rollout_iteration == 1 and progress.optimizer_step >= 1
    assert _changed(lora, adapter.module())
    assert all(torch.isfinite(v).all() for k, v in adapter.module().state_dict().items() if k in lora)


def test_replay_reproduces_the_rollout_log_probs(make_trainer, tmp_path, family) -> None:
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        adapter=family["adapter"],
        dirs=family["dirs"],
        rewards=JPEG,
        sampling={"steps": 5, "window": 2, "guidance": family["guidance"]},
        **SMALL,
    )
    report = check_consistency(trainer)
    assert report["ok"] and report["max_abs_ratio_error"] < 1e-5
