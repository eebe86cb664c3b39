"""The real trainers on the wan22-a14b family (a tiny random two-expert folder): each sample's sigma reaches its
expert, and only the experts chosen to train move."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_wan2_pipeline import load_wan2_adapter

from flowpost.core.diagnostics import check_consistency
from flowpost.core.trainers.rl.grpo import GRPOTrainer

FAMILY = "wan22-a14b"
SAMPLED_JPEG = [{"name": "jpeg_incompressibility", "frames": "sampled", "sampled_frames": 3}]
SMALL = {"prompts_per_iteration": 2, "group_size": 2, "rollout_batch_size": 4, "train_batch_size": 2}


def _moved(before: dict[str, torch.Tensor], module: torch.nn.Module, expert: str) -> bool:
    now = module.state_dict()
    return any(not torch.equal(now[k], v) for k, v in before.items() if k.startswith(f"{expert}."))


def test_one_sft_step_trains_the_high_noise_expert_alone(make_trainer, tmp_path, wan22_pipeline_dir, wan22_data_dirs):
    adapter = load_wan2_adapter(wan22_pipeline_dir, family=FAMILY, options={"experts": "high"})
    seen: list[torch.Tensor] = []
    velocity = adapter.velocity

    def recorded(latents: torch.Tensor, sigma: torch.Tensor, state: object) -> torch.Tensor:
        seen.append(sigma)  # the sigmas SFT trains at, passed on to the real network
        return velocity(latents, sigma, state)

    adapter.velocity = recorded  # type: ignore[method-assign]
    before = {k: v.clone() for k, v in adapter.module().state_dict().items()}
    trainer = make_trainer(tmp_path, adapter=adapter, dirs=wan22_data_dirs, max_steps=1, batch_size=2)
    assert trainer.start().optimizer_step == 1
    assert _moved(before, adapter.module(), "high") and not _moved(before, adapter.module(), "low")
    assert seen and all(bool(adapter.routes_high(sigma).all()) for sigma in seen)  # drawn in its range


def test_one_grpo_iteration_trains_lora_on_both_experts(make_trainer, tmp_path, wan22_pipeline_dir, wan22_data_dirs):
    adapter = load_wan2_adapter(wan22_pipeline_dir, family=FAMILY, options={"low_noise_guidance": 3.0})
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        adapter=adapter,
        dirs=wan22_data_dirs,
        lora_rank=4,
        rewards=SAMPLED_JPEG,
        sampling={"steps": 4, "guidance": 5.0},
        iterations=1,
        **SMALL,
    )
    assert adapter.routes_high(adapter.inference_sigmas(4)[:-1]).tolist() == [True, False, False, False]
    lora = {k: v.clone() for k, v in adapter.module().state_dict().items() if "lora_B" in k}
    progress = trainer.start()
    assert (progress.rollout_iteration, progress.optimizer_step) == (1, 2)
    assert _moved(lora, adapter.module(), "high") and _moved(lora, adapter.module(), "low")


def test_replay_reproduces_the_rollout_log_probs(make_trainer, tmp_path, wan22_pipeline_dir: Path, wan22_data_dirs):
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        adapter=load_wan2_adapter(wan22_pipeline_dir, family=FAMILY, options={"low_noise_guidance": 3.0}),
        dirs=wan22_data_dirs,
        rewards=SAMPLED_JPEG,
        sampling={"steps": 4, "guidance": 5.0},
        **SMALL,
    )
    report = check_consistency(trainer)
    assert report["ok"] and report["max_abs_ratio_error"] < 1e-5


def test_grpo_on_the_high_noise_expert_alone_passes_over_the_low_noise_steps(
    make_trainer, tmp_path, wan22_pipeline_dir: Path, wan22_data_dirs
) -> None:
    """One replayed step per pass: the three low-noise steps reach no trainable weight and give no gradient."""
    adapter = load_wan2_adapter(wan22_pipeline_dir, family=FAMILY, options={"experts": "high"})
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        adapter=adapter,
        dirs=wan22_data_dirs,
        lora_rank=4,
        rewards=SAMPLED_JPEG,
        sampling={"steps": 4, "guidance": 5.0},
        iterations=1,
        replay_steps_per_pass=1,
        **SMALL,
    )
    lora = {k: v.clone() for k, v in adapter.module().state_dict().items() if "lora_B" in k}
    assert trainer.start().rollout_iteration == 1
    assert _moved(lora, adapter.module(), "high") and all(not k.startswith("low.") for k in lora)


def test_a_resumed_grpo_stage_ends_with_both_experts_as_an_uninterrupted_one(
    make_trainer, tmp_path, wan22_pipeline_dir: Path, wan22_data_dirs
) -> None:
    """LoRA on both experts, a reference snapshot of both (kl_beta): stopped after one iteration and resumed."""

    def trainer(out: Path, iterations: int, resume: bool):  # noqa: ANN202
        torch.manual_seed(0)  # the same LoRA draw in each run (make_trainer adds it from the global generator)
        return make_trainer(
            out,
            cls=GRPOTrainer,
            adapter=load_wan2_adapter(wan22_pipeline_dir, family=FAMILY),
            dirs=wan22_data_dirs,
            lora_rank=2,
            rewards=SAMPLED_JPEG,
            sampling={"steps": 4, "guidance": 5.0},
            iterations=iterations,
            kl_beta=0.1,
            resume=resume,
            **SMALL,
        )

    straight = trainer(tmp_path / "straight", 2, resume=False)
    straight.start()
    trainer(tmp_path / "resumed", 1, resume=True).start()
    resumed = trainer(tmp_path / "resumed", 2, resume=True)
    assert resumed.start().rollout_iteration == 2
    a, b = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert {k.split(".")[0] for k in a if "lora_B" in k} == {"high", "low"}
    assert all(torch.equal(a[k], b[k]) for k in a)
