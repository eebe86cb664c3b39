"""The z-image family against the stock diffusers ``ZImagePipeline``, on a tiny random folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pretrained_stage import with_model
from tiny_z_image_pipeline import MAX_LENGTH, RESOLUTION, TEXT_WIDTH, load_z_image_adapter

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.registry import load_adapter
from flowpost.core.models.text_state import MaskedTextState
from flowpost.core.models.z_image import ZImageAdapter
from flowpost.core.sampling.ode import sample_ode
from flowpost.errors import FlowpostError

PROMPTS = ["a red cat", "a blue dog on a car"]


def _load(folder: Path, **options: Any) -> ZImageAdapter:
    adapter = load_z_image_adapter(folder, **options)
    assert isinstance(adapter, ZImageAdapter)
    return adapter


@pytest.fixture(scope="module")
def adapter(z_image_pipeline_dir: Path) -> ZImageAdapter:
    return _load(z_image_pipeline_dir)


@pytest.fixture(scope="module")
def stock(z_image_pipeline_dir: Path) -> Any:
    from diffusers import ZImagePipeline

    return ZImagePipeline.from_pretrained(z_image_pipeline_dir)


def _noise(adapter: ZImageAdapter, seed: int = 0) -> torch.Tensor:
    return torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(seed))


def _states(adapter: ZImageAdapter) -> tuple[MaskedTextState, MaskedTextState]:
    """The prompts' state and the null prompt's, one row per prompt."""
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0] * len(PROMPTS)))
    return state, negative


def test_the_registry_loads_a_pipeline_folder_by_path(adapter: ZImageAdapter, z_image_pipeline_dir: Path) -> None:
    assert adapter.latent_shape == (16, 8, 8)  # 8x8 latents of 16 channels; the transformer patches them
    assert adapter.vae_scale_factor == 2 and adapter.cfg_normalization == 0.0
    assert adapter.shift == 3.0 and not adapter.scheduler.config.use_dynamic_shifting  # Z-Image-Turbo's
    assert adapter.describe()["pretrained"]["path"] == str(z_image_pipeline_dir)


def test_conditions_are_the_stock_encode_prompt_rows_padded_and_masked(adapter: ZImageAdapter, stock: Any) -> None:
    batch = adapter.encode_conditions(PROMPTS)
    rows, _ = stock.encode_prompt(list(PROMPTS), do_classifier_free_guidance=False, max_sequence_length=MAX_LENGTH)
    lengths = [len(row) for row in rows]
    assert lengths[0] < lengths[1] and batch.token_states.shape == (2, lengths[1], TEXT_WIDTH)
    assert batch.pooled.shape == (2, 0) and batch.token_mask.sum(1).tolist() == lengths
    for index, row in enumerate(rows):
        torch.testing.assert_close(batch.token_states[index, : len(row)], row, rtol=0, atol=1e-6)
        assert not bool(batch.token_states[index, len(row) :].any())


def test_the_cached_padding_leaves_the_velocity_unchanged(adapter: ZImageAdapter) -> None:
    alone = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS[:1]))
    padded = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS)).index([0])
    assert padded.encoder_hidden_states.shape[1] > alone.encoder_hidden_states.shape[1]
    noise = _noise(adapter)[:1]
    with torch.no_grad():
        expected = adapter.velocity(noise, torch.tensor(0.7), alone)
        torch.testing.assert_close(adapter.velocity(noise, torch.tensor(0.7), padded), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("steps", [1, 4, 9])
def test_inference_sigmas_are_the_stock_pipelines(adapter: ZImageAdapter, stock: Any, steps: int) -> None:
    from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas

    scheduler = type(stock.scheduler).from_config(stock.scheduler.config)
    scheduler.set_timesteps(sigmas=get_default_z_image_sigmas(steps), mu=0.5)  # mu is ignored: a constant shift
    assert torch.equal(adapter.inference_sigmas(steps), scheduler.sigmas)
    shifted = 3.0 * 0.5 / (1 + 2.0 * 0.5)
    assert steps != 4 or float(adapter.inference_sigmas(steps)[2]) == pytest.approx(shifted)


@pytest.mark.parametrize(
    ("steps", "guidance_scale", "cfg_normalization"),
    [(4, 0.0, 0.0), (3, 3.0, 0.0), (3, 3.0, 1.0)],
    ids=["turbo-no-cfg", "cfg", "cfg-normalized"],
)
def test_the_ode_sampler_reproduces_the_stock_pipeline(
    z_image_pipeline_dir: Path, stock: Any, steps: int, guidance_scale: float, cfg_normalization: float
) -> None:
    adapter = _load(z_image_pipeline_dir)
    adapter.cfg_normalization = cfg_normalization
    noise = _noise(adapter)
    options = {
        "guidance_scale": guidance_scale,
        "cfg_normalization": cfg_normalization,
        "height": RESOLUTION,
        "width": RESOLUTION,
        "num_inference_steps": steps,
        "max_sequence_length": MAX_LENGTH,
    }
    expected = stock(list(PROMPTS), latents=noise.clone(), output_type="latent", **options).images
    state, negative = _states(adapter)
    sigmas = adapter.inference_sigmas(steps)
    with torch.no_grad():
        latents = sample_ode(adapter, noise, state, sigmas, guidance=guidance_scale + 1.0, negative=negative)
        torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)
        images = stock(list(PROMPTS), latents=noise.clone(), output_type="pt", **options).images
        torch.testing.assert_close(adapter.decode(latents), images, rtol=0, atol=1e-5)


def test_cfg_normalization_caps_each_samples_norm(z_image_pipeline_dir: Path) -> None:
    adapter = _load(z_image_pipeline_dir)
    state, negative = _states(adapter)
    noise, sigma = _noise(adapter), torch.tensor(0.6)
    with torch.no_grad():
        v_pos = adapter.velocity(noise, sigma, state)
        plain = adapter.forward(noise, sigma, state, guidance=6.0, negative=negative)
        adapter.cfg_normalization = 1.0
        capped = adapter.forward(noise, sigma, state, guidance=6.0, negative=negative)
    norms = [v.flatten(1).norm(dim=1) for v in (v_pos, plain, capped)]
    assert bool((norms[1] > norms[0]).all())
    torch.testing.assert_close(norms[2], norms[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(capped / norms[2].view(-1, 1, 1, 1), plain / norms[1].view(-1, 1, 1, 1))


@pytest.mark.parametrize(("value", "message"), [(-1.0, "cfg_normalization -1.0 is negative"), ("yes", "a number")])
def test_validate_refuses_a_bad_cfg_normalization_naming_its_path(
    tiny_pipeline, z_image_pipeline_dir: Path, value: Any, message: str
) -> None:
    options = {"resolution": RESOLUTION, "cfg_normalization": value}
    model = {"family": "z-image", "pretrained": str(z_image_pipeline_dir), "options": options}
    with pytest.raises(FlowpostError, match=rf"stages\.sft\.model\.options\.cfg_normalization: .*{message}"):
        validate_pipeline(with_model(tiny_pipeline, model))


def test_vae_latents_are_the_flux_vaes_shifted_and_scaled(adapter: ZImageAdapter) -> None:
    media = torch.rand(2, 3, RESOLUTION, RESOLUTION, generator=torch.Generator().manual_seed(0))
    vae = adapter.vae
    with torch.no_grad():
        raw = vae.encode(media * 2 - 1).latent_dist.mode()
        latents = adapter.encode_output_state(media)
    torch.testing.assert_close(latents, (raw - 0.1159) * 0.3611, rtol=1e-5, atol=1e-6)


def test_lora_on_the_single_stream_blocks_saves_and_loads_with_the_options(
    adapter: ZImageAdapter, z_image_pipeline_dir: Path, tmp_path: Path
) -> None:
    tuned = _load(z_image_pipeline_dir)
    tuned.cfg_normalization = 1.5
    tuned.add_lora(rank=2, alpha=2.0)
    trainable = [name for name, p in tuned.module().named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    for block in ("layers.1", "noise_refiner.0", "context_refiner.0"):
        for target in ("attention.to_q", "attention.to_out.0", "feed_forward.w2"):
            assert any(f"{block}.{target}.lora_A" in name for name in trainable), (block, target)
    with torch.no_grad():
        for name, param in tuned.module().named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    tuned.save_pretrained(tmp_path)
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, ZImageAdapter) and loaded.source == tuned.source
    assert (loaded.resolution, loaded.cfg_normalization, loaded.encoder_max_length) == (RESOLUTION, 1.5, MAX_LENGTH)
    state, _ = _states(adapter)
    with torch.no_grad():
        velocities = [a.velocity(_noise(adapter), torch.tensor([0.3, 0.8]), state) for a in (loaded, tuned, adapter)]
    torch.testing.assert_close(velocities[0], velocities[1], rtol=0, atol=1e-5)
    assert not torch.allclose(velocities[0], velocities[2])


def test_fsdp_shards_every_refiner_and_main_block(adapter: ZImageAdapter) -> None:
    units = adapter.shard_units()
    network = adapter.module()
    expected = [*network.noise_refiner, *network.context_refiner, *network.layers]
    assert len(units) == len(expected) == 4 and {id(u) for u in units} == {id(b) for b in expected}
