"""A LoRA stage over a quantized frozen base (``model.quantize``): the tiny family built as a stage builds it,
trained by GRPO, replayed, checkpointed, resumed and exported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pretrained_stage import sft_adapter
from safetensors.torch import load_file

from flowpost.core.diagnostics import check_consistency
from flowpost.core.models.base import ModelAdapter
from flowpost.core.models.compile import repeated_blocks
from flowpost.core.models.quantize import is_quantized
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.trainers.rl.grpo import GRPOTrainer

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}
GRPO = {"rewards": JPEG, "sampling": {"steps": 4}, "kl_beta": 0.1, "lr": 1e-3, **SMALL}


def quantized(tiny_pipeline, out: Path, kind: str = "int8") -> ModelAdapter:
    """The tiny family with LoRA rank 4 over a ``kind`` base, as ``flowpost.stage`` builds a stage's model."""
    config = tiny_pipeline()
    config["stages"]["sft"]["model"].update(lora={"rank": 4}, quantize=kind)
    return sft_adapter(config, out)


def _lora(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters() if "lora_" in k}


def _base(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The quantized weights as the values every pass multiplies by."""
    return {k: v.dequantize() for k, v in module.state_dict().items() if is_quantized(v)}


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_the_block_linears_are_quantized_and_the_adapters_train_in_fp32(make_trainer, tiny_pipeline, tmp_path, kind):
    adapter = quantized(tiny_pipeline, tmp_path / "model", kind)
    network = adapter.module()
    in_blocks = {id(p) for block in repeated_blocks(network) for p in block.parameters()}
    linears = [m for m in network.modules() if isinstance(m, torch.nn.Linear) and "lora" not in type(m).__name__]
    quantized_weights = {
        name for name, p in network.named_parameters() if is_quantized(p) and name.endswith("base_layer.weight")
    }
    assert quantized_weights and all(id(p) in in_blocks for p in network.parameters() if is_quantized(p))
    assert not any(is_quantized(p) for name, p in network.named_parameters() if "embed" in name or "proj_out" in name)
    assert all(not is_quantized(m.weight) for m in linears if id(m.weight) not in in_blocks)
    expected = torch.int8 if kind == "int8" else torch.float8_e4m3fn
    assert {p.qdata.dtype for p in network.parameters() if is_quantized(p)} == {expected}

    base, before = _base(network), _lora(network)
    trainer = make_trainer(tmp_path / "run", cls=GRPOTrainer, adapter=adapter, iterations=1, **GRPO)
    assert trainer.start().optimizer_step == 2
    trained = {k: p for k, p in network.named_parameters() if p.requires_grad}
    assert set(trained) == set(before) and all(
        type(p) is torch.nn.Parameter and p.dtype == torch.float32 for p in trained.values()
    )
    assert any(not torch.equal(before[k], p) for k, p in trained.items() if "lora_B" in k)
    for state in trainer.optimizer.optimizer.state.values():
        assert state["exp_avg"].dtype == torch.float32
    assert all(torch.equal(base[k], v) for k, v in _base(network).items())  # the base never moves


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_replay_over_the_quantized_base_reproduces_the_rollout_log_probs(make_trainer, tiny_pipeline, tmp_path, kind):
    adapter = quantized(tiny_pipeline, tmp_path / "model", kind)
    trainer = make_trainer(tmp_path, cls=GRPOTrainer, adapter=adapter, **{**GRPO, "sampling": {"steps": 5}})
    report = check_consistency(trainer)
    assert report["ok"] and report["max_abs_ratio_error"] < 1e-5


def test_a_quantized_stage_checkpoints_the_adapters_and_resumes_exactly(make_trainer, tiny_pipeline, tmp_path):
    straight = make_trainer(
        tmp_path / "straight",
        cls=GRPOTrainer,
        adapter=quantized(tiny_pipeline, tmp_path / "a"),
        resume=False,
        iterations=2,
        **GRPO,
    )
    straight.start()

    def resumable(iterations: int) -> GRPOTrainer:
        adapter = quantized(tiny_pipeline, tmp_path / "b")  # the base quantized afresh, as a restarted stage does
        return make_trainer(
            tmp_path / "resumed", cls=GRPOTrainer, adapter=adapter, checkpoint_every=1, iterations=iterations, **GRPO
        )

    resumable(1).start()
    saved = load_file(tmp_path / "resumed" / "checkpoints" / "step-2" / "model.safetensors")
    network = straight.adapter.module()
    assert not {k for k, v in network.state_dict().items() if is_quantized(v)} & set(saved)
    assert {k for k, p in network.named_parameters() if p.requires_grad} <= set(saved)
    resumed = resumable(2)
    assert resumed.start().optimizer_step == 4
    a, b = _lora(network), _lora(resumed.adapter.module())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(v, _base(resumed.adapter.module())[k]) for k, v in _base(network).items())


def test_the_export_is_the_dequantized_base_with_the_adapters_merged(tiny_pipeline, tmp_path):
    adapter = quantized(tiny_pipeline, tmp_path / "model")
    network = adapter.module()
    with torch.no_grad():
        for name, param in network.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    adapter.save_pretrained(tmp_path / "export")
    merged = TinySD3Adapter.from_pretrained(tmp_path / "export").module()
    assert not any(is_quantized(p) for p in merged.parameters())
    inputs: dict[str, Any] = {
        "hidden_states": torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(0)),
        "encoder_hidden_states": torch.randn(2, 16, 384, generator=torch.Generator().manual_seed(1)),
        "pooled_projections": torch.randn(2, 384, generator=torch.Generator().manual_seed(2)),
        "timestep": torch.tensor([300.0, 700.0]),
    }
    with torch.no_grad():
        trained, exported = network(**inputs).sample, merged(**inputs).sample
    assert torch.allclose(trained, exported, atol=1e-5)
    base = load_file(tmp_path / "export" / "lora_base" / "transformer" / "diffusion_pytorch_model.safetensors")
    dequantized = {k.replace("base_layer.", ""): v for k, v in _base(network).items()}
    assert all(torch.equal(base[k], v) for k, v in dequantized.items())
