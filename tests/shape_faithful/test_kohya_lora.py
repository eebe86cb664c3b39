"""FLUX.1-dev's kohya LoRA at the published width: a single block's ``linear1`` (q, k, v and the MLP input fused,
the split diffusers' conversion hard-codes at 3072) loads into the stock pipeline as the diffusers LoRA does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flowpost.core.models.flux1_kohya import FLUX1_KOHYA
from flowpost.core.models.kohya_lora import save_kohya_lora
from flowpost.core.models.lora import LORA_WEIGHTS, SD3_ATTENTION_TARGETS, add_lora, save_lora
from shape_faithful.build import transformer_config

pytestmark = pytest.mark.shape

RANK, ALPHA = 4, 6.0
IMAGE_TOKENS, TEXT_TOKENS = 16, 8


def _inputs(config: dict) -> dict:
    generator = torch.Generator().manual_seed(1)
    return {
        "hidden_states": torch.randn(1, IMAGE_TOKENS, config["in_channels"], generator=generator),
        "encoder_hidden_states": torch.randn(1, TEXT_TOKENS, config["joint_attention_dim"], generator=generator),
        "pooled_projections": torch.randn(1, config["pooled_projection_dim"], generator=generator),
        "timestep": torch.tensor([0.5]),
        "guidance": torch.tensor([3.5]),
        "img_ids": torch.zeros(IMAGE_TOKENS, 3),
        "txt_ids": torch.zeros(TEXT_TOKENS, 3),
        "return_dict": False,
    }


def test_the_fused_linear1_loads_as_the_diffusers_lora_does(tmp_path: Path) -> None:
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from safetensors import safe_open

    config = transformer_config("flux1-dev")
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel.from_config(config)  # fp32: the two loads compared to fp32 tolerance
    add_lora(transformer, rank=RANK, alpha=ALPHA, targets=SD3_ATTENTION_TARGETS)  # flux1's default targets
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    save_lora(transformer, tmp_path / "lora", pipeline_class="FluxPipeline")
    kohya = tmp_path / "kohya.safetensors"
    save_kohya_lora(tmp_path / "lora" / LORA_WEIGHTS, kohya, FLUX1_KOHYA, rank=RANK, alpha=ALPHA, metadata={})
    with safe_open(kohya, "pt") as file:  # q, k, v and the untrained MLP input (4x as wide): rank 4 * RANK
        assert file.get_slice("lora_unet_single_blocks_0_linear1.lora_up.weight").get_shape() == [7 * 3072, 4 * RANK]
    transformer.unload_lora()
    parts = ("scheduler", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
    pipe = FluxPipeline(transformer=transformer, **dict.fromkeys(parts))  # only the transformer is needed
    with torch.no_grad():
        untrained = pipe.transformer(**_inputs(config))[0]
        outputs = {}
        for name, lora in (("diffusers", tmp_path / "lora"), ("kohya", kohya)):
            pipe.load_lora_weights(lora, adapter_name=name)
            outputs[name] = pipe.transformer(**_inputs(config))[0]
            pipe.delete_adapters(name)
    torch.testing.assert_close(outputs["kohya"], outputs["diffusers"], rtol=0, atol=1e-5)
    assert not torch.allclose(untrained, outputs["diffusers"], atol=1e-3)  # the LoRA changed the output
