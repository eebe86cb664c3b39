"""``gradient_checkpointing: N`` recomputes the first N transformer blocks in backward: the same gradients as
no checkpointing, fewer tensors kept for backward the more blocks it covers, and the setting survives a save."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import SD3Transformer2DModel
from pretrained_stage import sft_adapter, with_model
from tiny_sd3_pipeline import TRANSFORMER

from flowpost.core.models.block_checkpointing import checkpointed_blocks, set_block_checkpointing
from flowpost.core.models.compile import repeated_blocks
from flowpost.core.models.registry import adapter_class
from flowpost.errors import FlowpostError


def _transformer(layers: int = 3) -> SD3Transformer2DModel:
    torch.manual_seed(0)
    return SD3Transformer2DModel(**{**TRANSFORMER, "num_layers": layers})


def _inputs(network: SD3Transformer2DModel) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    config = network.config
    side = config.sample_size
    return {
        "hidden_states": torch.randn(2, config.in_channels, side, side, generator=generator),
        "encoder_hidden_states": torch.randn(2, 5, config.joint_attention_dim, generator=generator),
        "pooled_projections": torch.randn(2, config.pooled_projection_dim, generator=generator),
        "timestep": torch.tensor([500.0, 250.0]),
    }


def _step(network: SD3Transformer2DModel) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """Loss, every gradient and the bytes autograd keeps for backward of one forward."""
    network.zero_grad(set_to_none=True)
    kept = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal kept
        kept += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = network(**_inputs(network), return_dict=False)[0].square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in network.parameters() if p.grad is not None], kept


def test_checkpointing_the_first_blocks_keeps_the_gradients_and_less_for_backward() -> None:
    network = _transformer()
    results = []  # a list: as dict keys, True and 1 are one key
    for setting in (False, 1, 2, True):
        set_block_checkpointing(network, setting, where="model.options.gradient_checkpointing")
        results.append(_step(network))
    assert checkpointed_blocks(network) == 3
    reference_loss, reference_grads, _ = results[0]
    for loss, grads, _ in results:
        assert torch.equal(loss, reference_loss)
        for grad, reference in zip(grads, reference_grads, strict=True):
            torch.testing.assert_close(grad, reference, rtol=1e-5, atol=1e-6)
    kept = [bytes_kept for _, _, bytes_kept in results]
    assert kept[0] > kept[1] > kept[2] > kept[3], kept


def test_the_setting_replaces_the_last_and_names_its_path_when_negative() -> None:
    network = _transformer()
    set_block_checkpointing(network, 2, where="x")
    assert checkpointed_blocks(network) == 2 and not network.is_gradient_checkpointing
    set_block_checkpointing(network, True, where="x")
    assert checkpointed_blocks(network) == 3 and network.is_gradient_checkpointing
    set_block_checkpointing(network, 1, where="x")
    assert checkpointed_blocks(network) == 1 and not network.is_gradient_checkpointing
    assert ["forward" in block.__dict__ for block in repeated_blocks(network)] == [True, False, False]
    set_block_checkpointing(network, False, where="x")
    assert checkpointed_blocks(network) == 0
    with pytest.raises(FlowpostError, match="model.options.gradient_checkpointing: gradient_checkpointing is -1"):
        set_block_checkpointing(network, -1, where="model.options.gradient_checkpointing")


def test_a_number_of_blocks_reaches_the_family_and_survives_a_save(
    tiny_pipeline: Any, sd3_pipeline_dir: Path, tmp_path: Path
) -> None:
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "options": {"gradient_checkpointing": 1}}
    adapter = sft_adapter(with_model(tiny_pipeline, model), tmp_path / "stage")
    assert checkpointed_blocks(adapter.transformer) == 1 and adapter.describe()["gradient_checkpointing"] == 1
    adapter.save_pretrained(tmp_path / "saved")
    loaded = adapter_class("sd3").from_pretrained(tmp_path / "saved")
    assert loaded.gradient_checkpointing == 1 and checkpointed_blocks(loaded.transformer) == 1
