"""The sd3 family against the stock diffusers SD3 pipeline, on a tiny random pipeline folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_sd3_pipeline import CLIP_G, CLIP_L, CLIP_LENGTH, T5_LENGTH, T5_WIDTH, load_sd3_adapter

from flowpost.core.models.registry import load_adapter
from flowpost.core.models.sd3 import SD3Adapter
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.sampling.ode import sample_ode
from flowpost.core.sampling.schedules import inference_sigmas

PROMPTS = ["a red cat", "a blue dog on a car"]


def _load(folder: Path, **options: Any) -> SD3Adapter:
    adapter = load_sd3_adapter(folder, **options)
    assert isinstance(adapter, SD3Adapter)
    return adapter


@pytest.fixture(scope="module")
def adapter(sd3_pipeline_dir: Path) -> SD3Adapter:
    return _load(sd3_pipeline_dir)


@pytest.fixture(scope="module")
def stock(sd3_pipeline_dir: Path) -> Any:
    from diffusers import StableDiffusion3Pipeline

    return StableDiffusion3Pipeline.from_pretrained(sd3_pipeline_dir)


def _noise(adapter: SD3Adapter, seed: int = 0) -> torch.Tensor:
    return torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(seed))


def _velocity(adapter: SD3Adapter) -> torch.Tensor:
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    with torch.no_grad():
        return adapter.velocity(_noise(adapter), torch.tensor([0.3, 0.8]), state)


def test_the_stock_pipeline_loads_the_folder_and_generates(stock: Any) -> None:
    images = stock(
        "a red cat",
        num_inference_steps=2,
        guidance_scale=4.0,
        max_sequence_length=T5_LENGTH,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert images.shape == (1, 3, 16, 16)
    assert torch.isfinite(images).all() and 0.0 <= float(images.min()) <= float(images.max()) <= 1.0


def test_the_registry_loads_a_pipeline_folder_by_path(adapter: SD3Adapter, sd3_pipeline_dir: Path) -> None:
    assert adapter.latent_shape == (16, 8, 8)
    assert adapter.shift == 3.0
    assert adapter.describe()["pretrained"]["path"] == str(sd3_pipeline_dir)


def test_conditions_are_the_stock_encode_prompt(adapter: SD3Adapter, stock: Any) -> None:
    batch = adapter.encode_conditions(PROMPTS)
    embeds, _, pooled, _ = stock.encode_prompt(
        PROMPTS, None, None, do_classifier_free_guidance=False, max_sequence_length=T5_LENGTH
    )
    assert batch.token_states.shape == (2, CLIP_LENGTH + T5_LENGTH, T5_WIDTH)
    assert batch.pooled.shape == (2, CLIP_L + CLIP_G)
    assert bool((batch.token_mask == 1).all())
    torch.testing.assert_close(batch.token_states, embeds.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(batch.pooled, pooled.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("steps", [1, 4, 28])
def test_inference_sigmas_are_the_schedulers(adapter: SD3Adapter, steps: int) -> None:
    scheduler = type(adapter.scheduler).from_config(adapter.scheduler.config)
    scheduler.set_timesteps(steps)
    assert torch.equal(adapter.inference_sigmas(steps), scheduler.sigmas)
    tiny = TinySD3Adapter.from_scratch(seed=0, shift=3.0, overrides={"num_layers": 1})
    assert torch.equal(tiny.inference_sigmas(steps), inference_sigmas(steps, shift=3.0))


@pytest.mark.parametrize(("steps", "guidance"), [(4, 1.0), (5, 4.5)])
def test_the_ode_sampler_reproduces_the_stock_pipeline(adapter: SD3Adapter, stock: Any, steps, guidance) -> None:
    noise = _noise(adapter)
    expected = stock(
        PROMPTS,
        latents=noise.clone(),
        num_inference_steps=steps,
        guidance_scale=guidance,
        max_sequence_length=T5_LENGTH,
        output_type="latent",
    ).images
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0, 0]))
    latents = sample_ode(adapter, noise, state, adapter.inference_sigmas(steps), guidance=guidance, negative=negative)
    torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)
    decoded = stock.image_processor.postprocess(
        stock.vae.decode(expected / stock.vae.config.scaling_factor + stock.vae.config.shift_factor)[0], "pt"
    )
    torch.testing.assert_close(adapter.decode(latents), decoded, rtol=0, atol=1e-5)


def test_save_and_load_keep_the_merged_weights(adapter: SD3Adapter, sd3_pipeline_dir: Path, tmp_path: Path) -> None:
    tuned = _load(sd3_pipeline_dir)
    tuned.add_lora(rank=2, alpha=2.0)
    trainable = [name for name, p in tuned.module().named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert any("add_q_proj.lora_A" in name for name in trainable)
    with torch.no_grad():
        for name, param in tuned.module().named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    tuned.save_pretrained(tmp_path)
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, SD3Adapter) and loaded.source == tuned.source
    torch.testing.assert_close(_velocity(loaded), _velocity(tuned), rtol=0, atol=1e-5)
    assert not torch.allclose(_velocity(loaded), _velocity(adapter))
