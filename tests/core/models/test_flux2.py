"""The flux2 families against the stock diffusers ``Flux2Pipeline`` and ``Flux2KleinPipeline``, on tiny random
folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_flux2_pipeline import (
    DEV_MAX_LENGTH,
    KLEIN_MAX_LENGTH,
    RESOLUTION,
    TEXT_WIDTH,
    load_flux2_adapter,
    load_flux2_klein_adapter,
)

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.flux2 import Flux2Adapter, Flux2Family, Flux2KleinAdapter
from flowpost.core.models.registry import load_adapter
from flowpost.core.models.text_state import TextState
from flowpost.core.sampling.ode import sample_ode

PROMPTS = ["a red cat", "a blue dog on a car"]
SIDE = 4  # the packed token grid: 16 pixels, VAE factor 2, 2x2 patches
FAMILIES = {  # family: (loader, folder fixture, max_sequence_length, stock pipeline class)
    "flux2": (load_flux2_adapter, "flux2_pipeline_dir", DEV_MAX_LENGTH, "Flux2Pipeline"),
    "flux2-klein": (load_flux2_klein_adapter, "flux2_klein_pipeline_dir", KLEIN_MAX_LENGTH, "Flux2KleinPipeline"),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> dict[str, Any]:
    """A family's folder, loader, token length and its stock pipeline loaded from the folder."""
    import diffusers

    load, folder_fixture, max_length, pipeline_class = FAMILIES[request.param]
    folder = request.getfixturevalue(folder_fixture)
    stock = getattr(diffusers, pipeline_class).from_pretrained(folder)
    return {"name": request.param, "load": load, "folder": folder, "max_length": max_length, "stock": stock}


def _noise(adapter: Flux2Family, seed: int = 0) -> torch.Tensor:
    return torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(seed))


def _grid(tokens: torch.Tensor) -> torch.Tensor:
    """Packed ``[B, tokens, C]`` as the stock pipelines take ``latents``: ``[B, C, side, side]``."""
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], SIDE, SIDE)


def _states(adapter: Flux2Family) -> tuple[TextState, TextState]:
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0] * len(PROMPTS)))
    return state, negative


def test_the_registry_loads_each_variant(flux2_pipeline_dir: Path, flux2_klein_pipeline_dir: Path) -> None:
    dev, klein = load_flux2_adapter(flux2_pipeline_dir), load_flux2_klein_adapter(flux2_klein_pipeline_dir)
    assert isinstance(dev, Flux2Adapter) and isinstance(klein, Flux2KleinAdapter)
    assert dev.latent_shape == klein.latent_shape == (SIDE * SIDE, 16)  # 4 VAE channels in 2x2 patches
    assert dev.vae_scale_factor == 2 and dev.shift == 1.0  # sampling shifts dynamically, training sigmas do not
    assert dev.guidance_distilled and not klein.guidance_distilled
    assert dev.distilled_guidance == 4.0 and "distilled_guidance" not in klein.options
    description = dev.describe()
    assert description["pretrained"]["path"] == str(flux2_pipeline_dir)
    assert "FLUX.2" in description["schedule"]["dynamic_shift"]["mu"]  # not FLUX.1's base and max shift


def test_conditions_are_the_stock_encode_prompt(family: dict[str, Any]) -> None:
    adapter = family["load"](family["folder"])
    batch = adapter.encode_conditions(PROMPTS)
    expected, _ = family["stock"].encode_prompt(prompt=list(PROMPTS), max_sequence_length=family["max_length"])
    assert batch.token_states.shape == (2, family["max_length"], 3 * TEXT_WIDTH)
    torch.testing.assert_close(batch.token_states, expected, rtol=0, atol=0)
    assert batch.pooled.shape == (2, 0) and bool(batch.token_mask.all())  # the transformer attends to all of it
    assert not torch.equal(batch.token_states[0], batch.token_states[1])


@pytest.mark.parametrize("steps", [1, 4, 28])
def test_inference_sigmas_shift_by_flux2s_empirical_mu(family: dict[str, Any], steps: int) -> None:
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    adapter = family["load"](family["folder"])
    scheduler = type(family["stock"].scheduler).from_config(family["stock"].scheduler.config)
    sigmas = [1.0 - index / steps for index in range(steps)]
    scheduler.set_timesteps(sigmas=sigmas, mu=compute_empirical_mu(SIDE * SIDE, steps))
    torch.testing.assert_close(adapter.inference_sigmas(steps), scheduler.sigmas, rtol=0, atol=1e-7)
    assert steps == 1 or float(adapter.inference_sigmas(steps)[1]) > 1 - 1 / steps  # shifted towards noise


@pytest.mark.parametrize(("steps", "guidance_scale"), [(3, 1.0), (4, 3.0)], ids=["no-cfg", "cfg"])
def test_the_ode_sampler_reproduces_the_stock_pipeline(
    family: dict[str, Any], steps: int, guidance_scale: float
) -> None:
    """dev embeds ``guidance_scale`` (flowpost's ``distilled_guidance``) and samples at guidance 1; klein's base
    runs CFG against the empty prompt at the same scale as flowpost's guidance."""
    adapter = family["load"](family["folder"])
    dev = family["name"] == "flux2"
    if dev:
        adapter.distilled_guidance = guidance_scale
    noise = _noise(adapter)
    options = {
        "prompt": list(PROMPTS),
        "height": RESOLUTION,
        "width": RESOLUTION,
        "num_inference_steps": steps,
        "guidance_scale": guidance_scale,
        "max_sequence_length": family["max_length"],
    }
    images = family["stock"](latents=_grid(noise), output_type="pt", **options).images
    state, negative = _states(adapter)
    with torch.no_grad():
        guidance = 1.0 if dev else guidance_scale
        latents = sample_ode(
            adapter, noise, state, adapter.inference_sigmas(steps), guidance=guidance, negative=negative
        )
        if dev:  # its latent output is the packed tokens
            expected = family["stock"](latents=_grid(noise), output_type="latent", **options).images
            torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(adapter.decode(latents), images, rtol=0, atol=1e-5)
    assert float(images.std()) > 0


def test_a_step_distilled_klein_samples_at_guidance_1_whatever_the_pipelines_scale(
    flux2_klein_pipeline_dir: Path,
) -> None:
    """``is_distilled`` klein checkpoints ignore ``guidance_scale`` (no CFG): flowpost's guidance 1."""
    from diffusers import Flux2KleinPipeline

    stock = Flux2KleinPipeline.from_pretrained(flux2_klein_pipeline_dir, is_distilled=True)
    adapter = load_flux2_klein_adapter(flux2_klein_pipeline_dir)
    noise = _noise(adapter)
    options = {
        "height": RESOLUTION,
        "width": RESOLUTION,
        "num_inference_steps": 4,
        "max_sequence_length": KLEIN_MAX_LENGTH,
    }
    images = stock(prompt=list(PROMPTS), latents=_grid(noise), guidance_scale=4.0, output_type="pt", **options).images
    state, _ = _states(adapter)
    with torch.no_grad():
        latents = sample_ode(adapter, noise, state, adapter.inference_sigmas(4), guidance=1.0)
        torch.testing.assert_close(adapter.decode(latents), images, rtol=0, atol=1e-5)


def test_vae_tokens_are_patches_normalised_by_the_batch_norm_statistics(flux2_pipeline_dir: Path) -> None:
    adapter = load_flux2_adapter(flux2_pipeline_dir)
    media = torch.rand(2, 3, RESOLUTION, RESOLUTION, generator=torch.Generator().manual_seed(0))
    vae = adapter.vae
    mean, var = vae.bn.running_mean, vae.bn.running_var
    assert not torch.equal(mean, torch.zeros_like(mean))  # the tiny folder's statistics are not the identity
    with torch.no_grad():
        raw = vae.encode(media * 2 - 1).latent_dist.mode()  # [2, 4, 8, 8]
        tokens = adapter.encode_output_state(media)
        decoded = adapter.decode(tokens)
        direct = vae.decode(raw, return_dict=False)[0]
    patch = raw[:, :, 2:4, 6:8].reshape(2, 16)  # the patch at row 1, column 3: token 1 * 4 + 3
    torch.testing.assert_close(tokens[:, 7], (patch - mean) / torch.sqrt(var + vae.config.batch_norm_eps))
    torch.testing.assert_close(decoded, (direct / 2 + 0.5).clamp(0, 1), rtol=1e-5, atol=1e-5)


def test_lora_covers_both_kinds_of_block_and_loads_with_the_options(flux2_pipeline_dir: Path, tmp_path: Path) -> None:
    adapter = load_flux2_adapter(flux2_pipeline_dir)
    tuned = load_flux2_adapter(flux2_pipeline_dir)
    tuned.distilled_guidance = 2.5
    tuned.add_lora(rank=2, alpha=2.0)
    trainable = [name for name, p in tuned.module().named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    for target in ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.add_v_proj"):
        assert any(f"{target}.lora_A" in name for name in trainable), target
    assert any("single_transformer_blocks.0.attn.to_qkv_mlp_proj.lora_A" in name for name in trainable)
    with torch.no_grad():
        for name, param in tuned.module().named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    tuned.save_pretrained(tmp_path)
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, Flux2Adapter) and loaded.source == tuned.source
    assert (loaded.resolution, loaded.distilled_guidance, loaded.encoder_max_length) == (RESOLUTION, 2.5, 64)
    state, _ = _states(adapter)
    with torch.no_grad():
        velocities = [a.velocity(_noise(adapter), torch.tensor([0.3, 0.8]), state) for a in (loaded, tuned, adapter)]
    torch.testing.assert_close(velocities[0], velocities[1], rtol=0, atol=1e-5)
    assert not torch.allclose(velocities[0], velocities[2])


def test_validate_accepts_a_flux2_stage_and_names_a_klein_folder_given_as_dev(
    tiny_pipeline, flux2_klein_pipeline_dir: Path
) -> None:
    from pretrained_stage import with_model

    from flowpost.errors import FlowpostError

    model = {"family": "flux2-klein", "pretrained": str(flux2_klein_pipeline_dir), "options": {"resolution": 16}}
    validate_pipeline(with_model(tiny_pipeline, model))
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model.*Flux2KleinPipeline.*set model\.family: flux2-klein"):
        validate_pipeline(with_model(tiny_pipeline, {**model, "family": "flux2"}))
