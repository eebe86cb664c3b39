"""The qwen-image family against the stock diffusers ``QwenImagePipeline``, on a tiny random folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tiny_qwen_image_pipeline import (
    MAX_LENGTH,
    RESOLUTION,
    TEMPLATE_PREFIX,
    TEXT_WIDTH,
    load_qwen_image_adapter,
)

from flowpost.core.models.qwen_image import QwenImageAdapter
from flowpost.core.models.registry import load_adapter
from flowpost.core.models.text_state import MaskedTextState
from flowpost.core.sampling.guidance import classifier_free_guidance
from flowpost.core.sampling.ode import sample_ode
from flowpost.errors import FlowpostError

PROMPTS = ["a red cat", "a blue dog on a car"]


def _load(folder: Path, **options: Any) -> QwenImageAdapter:
    adapter = load_qwen_image_adapter(folder, **options)
    assert isinstance(adapter, QwenImageAdapter)
    return adapter


@pytest.fixture(scope="module")
def adapter(qwen_image_pipeline_dir: Path) -> QwenImageAdapter:
    return _load(qwen_image_pipeline_dir)


@pytest.fixture(scope="module")
def stock(qwen_image_pipeline_dir: Path) -> Any:
    from diffusers import QwenImagePipeline

    return QwenImagePipeline.from_pretrained(qwen_image_pipeline_dir)


def _noise(adapter: QwenImageAdapter, seed: int = 0) -> torch.Tensor:
    return torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(seed))


def _states(adapter: QwenImageAdapter) -> tuple[MaskedTextState, MaskedTextState]:
    """The prompts' state and the null prompt's, one row per prompt."""
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0] * len(PROMPTS)))
    return state, negative


def test_the_stock_pipeline_loads_the_folder_and_generates(stock: Any) -> None:
    assert len(stock.tokenizer(TEMPLATE_PREFIX).input_ids) == stock.prompt_template_encode_start_idx == 34
    images = stock(
        "a red cat",
        negative_prompt="",
        true_cfg_scale=4.0,
        height=RESOLUTION,
        width=RESOLUTION,
        num_inference_steps=2,
        max_sequence_length=MAX_LENGTH,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert images.shape == (1, 3, RESOLUTION, RESOLUTION)
    assert torch.isfinite(images).all() and 0.0 <= float(images.min()) <= float(images.max()) <= 1.0


def test_the_registry_loads_a_pipeline_folder_by_path(adapter: QwenImageAdapter, qwen_image_pipeline_dir) -> None:
    assert adapter.latent_shape == (16, 64)  # 8x8 latents of 16 channels, packed 2x2
    assert adapter.vae_scale_factor == 2 and adapter.cfg_norm
    assert adapter.scheduler.config.use_dynamic_shifting and adapter.scheduler.config.shift_terminal == 0.02
    assert adapter.describe()["pretrained"]["path"] == str(qwen_image_pipeline_dir)


def test_conditions_are_the_stock_encode_prompt_with_its_mask(adapter: QwenImageAdapter, stock: Any) -> None:
    batch = adapter.encode_conditions(PROMPTS)
    embeds, mask = stock.encode_prompt(PROMPTS, max_sequence_length=MAX_LENGTH)
    assert batch.token_states.shape == (2, embeds.shape[1], TEXT_WIDTH) and batch.pooled.shape == (2, 0)
    assert mask is not None and not bool(mask.all())  # the shorter prompt is padded
    assert torch.equal(batch.token_mask.long(), mask)
    torch.testing.assert_close(batch.token_states, embeds.detach(), rtol=0, atol=1e-6)
    single = adapter.encode_conditions(PROMPTS[:1])
    assert stock.encode_prompt(PROMPTS[:1], max_sequence_length=MAX_LENGTH)[1] is None
    assert bool((single.token_mask == 1).all()) and adapter.prepare_condition_state(single).mask() is None


def test_the_cached_padding_leaves_the_velocity_unchanged(adapter: QwenImageAdapter) -> None:
    batch = adapter.encode_conditions(PROMPTS)
    alone = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS[:1]))
    padded = adapter.prepare_condition_state(batch).index([0])
    assert padded.encoder_hidden_states.shape[1] > alone.encoder_hidden_states.shape[1]
    longer = type(batch)(  # a cache padded further than any prompt: trimmed to the longest real row
        torch.cat([batch.token_states, torch.zeros(2, 5, TEXT_WIDTH)], 1),
        torch.cat([batch.token_mask, torch.zeros(2, 5, dtype=batch.token_mask.dtype)], 1),
        batch.pooled,
    )
    assert adapter.prepare_condition_state(longer).encoder_hidden_states.shape[1] == batch.token_states.shape[1]
    noise = _noise(adapter)[:1]
    with torch.no_grad():
        expected = adapter.velocity(noise, torch.tensor(0.7), alone)
        torch.testing.assert_close(adapter.velocity(noise, torch.tensor(0.7), padded), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("steps", [2, 4, 28])
def test_inference_sigmas_are_the_stock_pipelines(adapter: QwenImageAdapter, steps: int) -> None:
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    config = adapter.scheduler.config
    scheduler = type(adapter.scheduler).from_config(config)
    mu = calculate_shift(16, config.base_image_seq_len, config.max_image_seq_len, config.base_shift, config.max_shift)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    assert torch.equal(adapter.inference_sigmas(steps), scheduler.sigmas)
    assert float(scheduler.sigmas[-2]) == pytest.approx(0.02)  # shift_terminal


def test_one_step_with_a_terminal_shift_is_refused(adapter: QwenImageAdapter) -> None:
    with pytest.raises(FlowpostError, match=r"sampling\.steps.*not finite.*use more steps"):
        adapter.inference_sigmas(1)


@pytest.mark.parametrize(("steps", "true_cfg"), [(4, 1.0), (3, 4.0)])
def test_the_ode_sampler_reproduces_the_stock_pipeline(adapter, stock, steps: int, true_cfg: float) -> None:
    noise = _noise(adapter)
    options = {
        "negative_prompt": [""] * len(PROMPTS) if true_cfg > 1 else None,
        "true_cfg_scale": true_cfg,
        "height": RESOLUTION,
        "width": RESOLUTION,
        "num_inference_steps": steps,
        "max_sequence_length": MAX_LENGTH,
    }
    expected = stock(PROMPTS, latents=noise.clone(), output_type="latent", **options).images
    state, negative = _states(adapter)
    latents = sample_ode(adapter, noise, state, adapter.inference_sigmas(steps), guidance=true_cfg, negative=negative)
    torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)
    images = stock(PROMPTS, latents=noise.clone(), output_type="pt", **options).images
    torch.testing.assert_close(adapter.decode(latents), images, rtol=0, atol=1e-5)


def test_cfg_norm_rescales_each_token_to_the_conditional_norm(qwen_image_pipeline_dir: Path) -> None:
    adapter = _load(qwen_image_pipeline_dir)
    state, negative = _states(adapter)
    noise, sigma = _noise(adapter), torch.tensor(0.6)
    with torch.no_grad():
        v_pos, v_neg = adapter.velocity(noise, sigma, state), adapter.velocity(noise, sigma, negative)
        rescaled = adapter.forward(noise, sigma, state, guidance=4.0, negative=negative)
        adapter.cfg_norm = False
        plain = adapter.forward(noise, sigma, state, guidance=4.0, negative=negative)
    torch.testing.assert_close(plain, classifier_free_guidance(v_pos, v_neg, 4.0), rtol=0, atol=1e-5)
    torch.testing.assert_close(rescaled.norm(dim=-1), v_pos.norm(dim=-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rescaled / rescaled.norm(dim=-1, keepdim=True), plain / plain.norm(dim=-1, keepdim=True))
    assert not torch.allclose(rescaled, plain, atol=1e-3)


def test_vae_latents_are_normalised_by_the_vaes_statistics(adapter: QwenImageAdapter) -> None:
    media = torch.rand(2, 3, RESOLUTION, RESOLUTION, generator=torch.Generator().manual_seed(0))
    vae = adapter.vae
    with torch.no_grad():
        raw = vae.encode(media.unsqueeze(2) * 2 - 1).latent_dist.mode()
        packed = adapter.encode_output_state(media)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    expected = adapter.stock_pipeline._pack_latents((raw - mean) / std, 2, 16, 8, 8)
    torch.testing.assert_close(packed, expected, rtol=1e-5, atol=1e-6)


def test_save_and_load_keep_the_merged_weights_and_options(adapter, qwen_image_pipeline_dir, tmp_path) -> None:
    tuned = _load(qwen_image_pipeline_dir)
    tuned.cfg_norm = False
    tuned.add_lora(rank=2, alpha=2.0)
    trainable = [name for name, p in tuned.module().named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    for target in ("attn.add_q_proj", "attn.to_out.0", "img_mlp.net.2", "txt_mlp.net.0.proj"):
        assert any(f"transformer_blocks.1.{target}.lora_A" in name for name in trainable), target
    with torch.no_grad():
        for name, param in tuned.module().named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    tuned.save_pretrained(tmp_path)
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, QwenImageAdapter) and loaded.source == tuned.source
    assert (loaded.resolution, loaded.cfg_norm, loaded.encoder_max_length) == (RESOLUTION, False, MAX_LENGTH)
    state, _ = _states(adapter)
    with torch.no_grad():
        velocities = [a.velocity(_noise(adapter), torch.tensor([0.3, 0.8]), state) for a in (loaded, tuned, adapter)]
    torch.testing.assert_close(velocities[0], velocities[1], rtol=0, atol=1e-5)
    assert not torch.allclose(velocities[0], velocities[2])
