"""``adamw8bit``: 8-bit moments where torchao quantizes them, written to checkpoints as plain tensors, and a
resumed stage (SFT full and LoRA, GRPO) bit-identical to an uninterrupted one in weights, moments and losses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torchao.optim.subclass_8bit import OptimState8bit

from flowpost.core.checkpoint import latest_checkpoint, load_checkpoint
from flowpost.core.events import read_events
from flowpost.core.trainers.base import BaseTrainer
from flowpost.core.trainers.optimizers import OptimizerConfig, build_role_optimizer, check_role_optimizers
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.errors import FlowpostError

LORA_RANK = 256  # the tiny network's adapters reach torchao's 4096 values only at this rank


def _moments(trainer: BaseTrainer) -> list[torch.Tensor]:
    """Every moment of the trainer's optimizer, 8-bit ones as their codes and scales."""
    out = []
    for state in trainer.optimizer.optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            value = state[key]
            out += [value.codes, value.scale] if isinstance(value, OptimState8bit) else [value]
    return out


def _losses(out: Path) -> list[float]:
    return [e["metrics"]["loss"] for e in read_events(out / "events.jsonl") if e["event"] == "progress"]


def _assert_resumes_exactly(make_trainer: Any, tmp_path: Path, *, total: dict, first: dict, **settings: Any) -> None:
    """A stage run straight to ``total`` and one stopped at ``first`` then resumed end identical (LoRA adapters
    start from the global generator, seeded alike before each stage is built)."""
    torch.manual_seed(0)
    straight = make_trainer(tmp_path / "straight", resume=False, log_every=1, **settings, **total)
    straight.start()
    assert any(isinstance(v, OptimState8bit) for s in straight.optimizer.optimizer.state.values() for v in s.values())
    torch.manual_seed(0)
    make_trainer(tmp_path / "resumed", checkpoint_every=1, log_every=1, **settings, **first).start()
    resumed = make_trainer(tmp_path / "resumed", checkpoint_every=1, log_every=1, **settings, **total)
    resumed.start()
    assert resumed.progress == straight.progress
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    moments_a, moments_b = _moments(straight), _moments(resumed)
    assert len(moments_a) == len(moments_b) > 0
    assert all(torch.equal(x, y) for x, y in zip(moments_a, moments_b, strict=True))
    losses = _losses(tmp_path / "resumed")  # the first run's steps, then the resumed run's
    assert losses == _losses(tmp_path / "straight") and len(set(losses)) > 1


def test_full_fine_tuning_sft_resumes_bit_identically_through_a_warm_up(make_trainer, tmp_path):
    _assert_resumes_exactly(
        make_trainer,
        tmp_path,
        optimizer="adamw8bit",
        warmup_steps=3,  # torchao keeps lr as a tensor, which the schedule fills
        total={"max_steps": 4},
        first={"max_steps": 2},
    )


@pytest.mark.slow  # torch.compile builds torchao's step for each new parameter shape
def test_lora_sft_resumes_bit_identically(make_trainer, tmp_path):
    _assert_resumes_exactly(
        make_trainer,
        tmp_path,
        optimizer="adamw8bit",
        lora_rank=LORA_RANK,
        total={"max_steps": 4},
        first={"max_steps": 2},
    )


@pytest.mark.slow
def test_grpo_resumes_bit_identically(make_trainer, tmp_path):
    settings = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}
    _assert_resumes_exactly(
        make_trainer,
        tmp_path,
        cls=GRPOTrainer,
        optimizer="adamw8bit",
        rewards=[{"name": "jpeg_incompressibility"}],
        sampling={"steps": 4},
        kl_beta=0.1,
        total={"iterations": 2},
        first={"iterations": 1},
        **settings,
    )


def test_a_checkpoint_holds_the_8_bit_moments_as_plain_tensors(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, optimizer="adamw8bit", max_steps=1, checkpoint_every=1)
    trainer.start()
    saved = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"), verified=True).optimizer["state"]
    values = [v for moments in saved.values() for v in moments.values()]
    assert not any(isinstance(v, OptimState8bit) for v in values)
    codes = [v for v in values if isinstance(v, dict)]
    assert codes and all(c["int8_codes"].dtype == torch.uint8 and type(c["int8_codes"]) is torch.Tensor for c in codes)
    live = [v for s in trainer.optimizer.optimizer.state.values() for v in s.values() if isinstance(v, OptimState8bit)]
    assert sorted(c["int8_codes"].numel() for c in codes) == sorted(v.codes.numel() for v in live)


def test_a_role_named_adamw8bit_gets_torchao_s_optimizer_with_its_settings_and_only_on_ddp():
    from torchao.optim import AdamW8bit

    config = OptimizerConfig(name="adamw8bit", lr=2e-3, adam_betas=(0.8, 0.95), weight_decay=0.1)
    role = build_role_optimizer("generator", [("weight", torch.nn.Parameter(torch.ones(64, 64)))], config, stage="d")
    [optimizer] = role.optimizer
    assert isinstance(optimizer, AdamW8bit) and optimizer.block_size == 256
    assert optimizer.defaults["betas"] == (0.8, 0.95) and optimizer.defaults["weight_decay"] == 0.1
    assert float(optimizer.param_groups[0]["lr"]) == pytest.approx(2e-3)  # torchao holds it as an fp32 tensor
    check_role_optimizers(("generator",), {"generator": config}, "ddp", 2, stage="d")
    with pytest.raises(FlowpostError, match=r"stages.d.optimizers.generator.name: adamw8bit runs on .* ddp only"):
        check_role_optimizers(("generator",), {"generator": config}, "fsdp2", 2, stage="d")


@pytest.mark.slow
def test_dmd2_with_an_adamw8bit_role_resumes_bit_identically(make_trainer, tmp_path):
    from flowpost.core.trainers.distill.dmd2 import DMD2Trainer
    from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR

    settings = {
        "cls": DMD2Trainer,
        "sampling": {"dynamics": "ode", "steps": 2, "guidance": 1.0},
        "optimizers": {GENERATOR: {"lr": 1e-3}, FAKE_SCORE: {"name": "adamw8bit", "lr": 2e-3}},
        "prompts_per_iteration": 4,
        "group_size": 1,
        "rollout_batch_size": 4,
        "train_batch_size": 4,
        "ttur": 2,
    }
    straight = make_trainer(tmp_path / "straight", resume=False, iterations=2, **settings)
    straight.start()
    make_trainer(tmp_path / "resumed", checkpoint_every=1, iterations=1, **settings).start()
    resumed = make_trainer(tmp_path / "resumed", checkpoint_every=1, iterations=2, **settings)
    resumed.start()
    [a], [b] = straight.roles[FAKE_SCORE].optimizer, resumed.roles[FAKE_SCORE].optimizer
    moments = [(x[k], y[k]) for x, y in zip(a.state.values(), b.state.values(), strict=True) for k in ("exp_avg",)]
    assert any(isinstance(x, OptimState8bit) for x, _ in moments)
    assert all(
        torch.equal(x.codes, y.codes) and torch.equal(x.scale, y.scale)
        if isinstance(x, OptimState8bit)
        else torch.equal(x, y)
        for x, y in moments
    )
    for role in (GENERATOR, FAKE_SCORE):
        wa = straight.adapter.variants.module(role).state_dict()
        wb = resumed.adapter.variants.module(role).state_dict()
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_empty_state_a_rank_other_than_0_gathers_passes_through() -> None:
    from flowpost.core.trainers.eight_bit import plain_state, quantized_state

    assert plain_state({}) == {} and quantized_state({}) == {}
