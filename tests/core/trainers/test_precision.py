"""Each part's precision when a family loads in bf16: trainable weights and optimizer state in fp32, the frozen
base as loaded, the network under bf16 autocast, the VAE in fp32 — and a small learning rate still moves LoRA."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pipeline_families import PIPELINE_FAMILIES
from tiny_sd3_pipeline import load_sd3_adapter

from flowpost.core.diagnostics import check_consistency
from flowpost.core.trainers.offline.sft import SFTTrainer
from flowpost.core.trainers.rl.grpo import GRPOTrainer

BF16 = {"torch_dtype": "bfloat16"}
ROLLOUTS = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 2}


@pytest.fixture(params=sorted(PIPELINE_FAMILIES))
def bf16_family(request: pytest.FixtureRequest, load_family) -> dict[str, Any]:
    return load_family(request.param, **BF16)


def _lora(module: torch.nn.Module, part: str) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters() if part in k}


def _changed_fraction(before: dict[str, torch.Tensor], module: torch.nn.Module) -> float:
    now = dict(module.named_parameters())
    changed = sum(int((now[k].detach() != v.to(now[k].dtype)).sum()) for k, v in before.items())
    return changed / sum(v.numel() for v in before.values())


def test_lr_1e5_moves_fp32_lora_adapters_on_a_bf16_base(make_trainer, tmp_path, bf16_family) -> None:
    adapter = bf16_family["adapter"]
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        adapter=adapter,
        dirs=bf16_family["dirs"],
        lora_rank=4,
        lr=1e-5,
        rewards=[{"name": "jpeg_incompressibility"}],
        sampling={"steps": 3, "guidance": bf16_family["guidance"]},
        iterations=1,
        **ROLLOUTS,
    )
    network = adapter.module()
    trainable = [p for p in network.parameters() if p.requires_grad]
    frozen = [p for p in network.parameters() if not p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    assert {p.dtype for p in frozen} == {torch.bfloat16}  # the base stays as loaded
    assert adapter.compute_dtype == torch.bfloat16
    lora_a, lora_b = _lora(network, "lora_A"), _lora(network, "lora_B")
    progress = trainer.start()
    assert progress.optimizer_step >= 3
    state = [s for s in trainer.optimizer.optimizer.state.values() if "exp_avg" in s]
    assert state and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in state)
    # B starts at zero, where bf16 is fine-grained; A moves by ~lr once B is non-zero, far below bf16's spacing
    # at A's magnitude, so in bf16 A would not move at all. (Some adapters get no gradient: the last block's
    # text-stream outputs feed nothing.)
    assert _changed_fraction(lora_b, network) > 0.5
    assert _changed_fraction(lora_a, network) > 0.5


def test_full_fine_tuning_of_a_bf16_model_keeps_fp32_master_weights(
    make_trainer, tmp_path, sd3_pipeline_dir, sd3_data_dirs
) -> None:
    adapter = load_sd3_adapter(sd3_pipeline_dir, **BF16)
    before = {k: v.detach().float().clone() for k, v in adapter.module().named_parameters()}
    trainer = make_trainer(tmp_path, cls=SFTTrainer, adapter=adapter, dirs=sd3_data_dirs, lr=1e-5, max_steps=2)
    assert all(p.dtype == torch.float32 for p in adapter.module().parameters())
    assert adapter.compute_dtype == torch.bfloat16
    trainer.start()
    assert _changed_fraction(before, adapter.module()) > 0.5  # bf16 weights would round most updates away


@pytest.mark.parametrize("family", sorted(PIPELINE_FAMILIES))
def test_the_vae_of_a_bf16_family_encodes_and_decodes_in_fp32(load_family, family) -> None:
    adapter, full = load_family(family, **BF16)["adapter"], load_family(family)["adapter"]
    assert {p.dtype for p in adapter.vae.parameters()} == {torch.float32}
    side = getattr(adapter, "resolution", 16)  # the packed-latent families' own
    media = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        latents = adapter.encode_output_state(media)
        assert torch.equal(latents, full.encode_output_state(media))  # what an fp32 load encodes, bit for bit
        images = adapter.decode(latents)
        assert images.dtype == torch.float32 and torch.equal(images, full.decode(latents))


def test_replay_in_bf16_autocast_reproduces_the_rollout_log_probs(make_trainer, tmp_path, bf16_family) -> None:
    trainer = make_trainer(
        tmp_path,
        cls=GRPOTrainer,
        adapter=bf16_family["adapter"],
        dirs=bf16_family["dirs"],
        lora_rank=4,
        rewards=[{"name": "jpeg_incompressibility"}],
        sampling={"steps": 5, "window": 2, "guidance": bf16_family["guidance"]},
        **ROLLOUTS,
    )
    report = check_consistency(trainer)
    print(report)
    assert report["ok"]
