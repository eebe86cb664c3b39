"""The flux1 family against the stock diffusers FLUX pipeline, on tiny random dev and schnell folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tiny_flux1_pipeline import CLIP_WIDTH, RESOLUTION, T5_LENGTH, build_tiny_flux1_pipeline, load_flux1_adapter
from tiny_sd3_pipeline import T5_WIDTH

from flowpost.core.models.flux1 import Flux1Adapter
from flowpost.core.models.registry import load_adapter
from flowpost.core.sampling.ode import sample_ode
from flowpost.core.sampling.schedules import flux_sigmas

PROMPTS = ["a red cat", "a blue dog on a car"]


def _load(folder: Path, **options: Any) -> Flux1Adapter:
    adapter = load_flux1_adapter(folder, **options)
    assert isinstance(adapter, Flux1Adapter)
    return adapter


@pytest.fixture(scope="module")
def schnell_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_flux1_pipeline(tmp_path_factory.mktemp("schnell") / "pipeline", variant="schnell")


@pytest.fixture(scope="module", params=["dev", "schnell"])
def folder(request: pytest.FixtureRequest, flux1_pipeline_dir: Path, schnell_dir: Path) -> Path:
    return flux1_pipeline_dir if request.param == "dev" else schnell_dir


@pytest.fixture(scope="module")
def adapter(flux1_pipeline_dir: Path) -> Flux1Adapter:
    return _load(flux1_pipeline_dir)


def _stock(folder: Path) -> Any:
    from diffusers import FluxPipeline

    return FluxPipeline.from_pretrained(folder)


def _noise(adapter: Flux1Adapter, seed: int = 0) -> torch.Tensor:
    return torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(seed))


def _velocity(adapter: Flux1Adapter) -> torch.Tensor:
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    with torch.no_grad():
        return adapter.velocity(_noise(adapter), torch.tensor([0.3, 0.8]), state)


def test_the_stock_pipeline_loads_the_folder_and_generates(folder: Path) -> None:
    images = _stock(folder)(
        "a red cat",
        height=RESOLUTION,
        width=RESOLUTION,
        num_inference_steps=2,
        max_sequence_length=T5_LENGTH,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert images.shape == (1, 3, RESOLUTION, RESOLUTION)
    assert torch.isfinite(images).all() and 0.0 <= float(images.min()) <= float(images.max()) <= 1.0


def test_the_registry_loads_a_pipeline_folder_by_path(adapter: Flux1Adapter, flux1_pipeline_dir: Path) -> None:
    assert adapter.latent_shape == (16, 64)  # 8x8 latents of 16 channels, packed 2x2
    assert adapter.transformer.config.guidance_embeds and adapter.distilled_guidance == 3.5
    assert adapter.describe()["pretrained"]["path"] == str(flux1_pipeline_dir)


def test_conditions_are_the_stock_encode_prompt(adapter: Flux1Adapter, flux1_pipeline_dir: Path) -> None:
    batch = adapter.encode_conditions(PROMPTS)
    embeds, pooled, text_ids = _stock(flux1_pipeline_dir).encode_prompt(PROMPTS, None, max_sequence_length=T5_LENGTH)
    assert batch.token_states.shape == (2, T5_LENGTH, T5_WIDTH) and batch.pooled.shape == (2, CLIP_WIDTH)
    assert bool((batch.token_mask == 1).all()) and not text_ids.any()
    torch.testing.assert_close(batch.token_states, embeds, rtol=0, atol=1e-6)
    torch.testing.assert_close(batch.pooled, pooled, rtol=0, atol=1e-6)


@pytest.mark.parametrize("steps", [1, 4, 28])
def test_inference_sigmas_are_the_stock_pipelines(folder: Path, steps: int) -> None:
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    adapter = _load(folder)
    scheduler = type(adapter.scheduler).from_config(adapter.scheduler.config)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=calculate_shift(16))
    assert torch.equal(adapter.inference_sigmas(steps), scheduler.sigmas)
    if scheduler.config.use_dynamic_shifting:  # dev: flowpost's own FLUX schedule agrees
        torch.testing.assert_close(flux_sigmas(steps, 16), scheduler.sigmas, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("steps", "true_cfg"), [(4, 1.0), (3, 2.5)])
def test_the_ode_sampler_reproduces_the_stock_pipeline(folder: Path, steps: int, true_cfg: float) -> None:
    adapter, stock = _load(folder, torch_dtype="float32"), _stock(folder)
    adapter.distilled_guidance = 5.0
    noise = _noise(adapter)
    expected = stock(
        PROMPTS,
        negative_prompt=[""] * len(PROMPTS) if true_cfg > 1 else None,
        true_cfg_scale=true_cfg,
        guidance_scale=5.0,
        latents=noise.clone(),
        height=RESOLUTION,
        width=RESOLUTION,
        num_inference_steps=steps,
        max_sequence_length=T5_LENGTH,
        output_type="latent",
    ).images
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0, 0]))
    latents = sample_ode(adapter, noise, state, adapter.inference_sigmas(steps), guidance=true_cfg, negative=negative)
    torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)
    unpacked = stock._unpack_latents(expected, RESOLUTION, RESOLUTION, stock.vae_scale_factor)
    decoded = stock.image_processor.postprocess(
        stock.vae.decode(unpacked / stock.vae.config.scaling_factor + stock.vae.config.shift_factor)[0], "pt"
    )
    torch.testing.assert_close(adapter.decode(latents), decoded, rtol=0, atol=1e-5)


def test_distilled_guidance_moves_the_velocity(flux1_pipeline_dir: Path) -> None:
    adapter = _load(flux1_pipeline_dir)
    default = _velocity(adapter)
    adapter.distilled_guidance = 1.0
    assert not torch.allclose(_velocity(adapter), default)


def test_save_and_load_keep_the_merged_weights_and_options(adapter: Flux1Adapter, flux1_pipeline_dir, tmp_path) -> None:
    tuned = _load(flux1_pipeline_dir)
    tuned.distilled_guidance = 4.0
    tuned.add_lora(rank=2, alpha=2.0)
    trainable = [name for name, p in tuned.module().named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert any("add_q_proj.lora_A" in name for name in trainable)
    assert any("single_transformer_blocks.0.attn.to_q.lora_A" in name for name in trainable)
    with torch.no_grad():
        for name, param in tuned.module().named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    tuned.save_pretrained(tmp_path)
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, Flux1Adapter) and loaded.source == tuned.source
    assert (loaded.resolution, loaded.distilled_guidance, loaded.encoder_max_length) == (RESOLUTION, 4.0, T5_LENGTH)
    torch.testing.assert_close(_velocity(loaded), _velocity(tuned), rtol=0, atol=1e-5)
    assert not torch.allclose(_velocity(loaded), _velocity(adapter))
