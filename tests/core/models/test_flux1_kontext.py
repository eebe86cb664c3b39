"""The flux1-kontext family against the stock diffusers ``FluxKontextPipeline``, on a tiny random folder.

The stock pipeline reads a square source at 1024 x 1024 pixels, which the tiny VAE encodes in seconds on a CPU:
the tests that encode sources are slow; the others give the stock pipeline seeded source latents directly (its
``image`` may be latents) with a small source grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from edit_pairs import random_sources
from tiny_flux1_kontext_pipeline import (
    RESOLUTION,
    SOURCE_TOKENS,
    load_flux1_kontext_adapter,
    seeded_kontext_latents,
    seeded_kontext_states,
)
from tiny_flux1_pipeline import CLIP_WIDTH
from tiny_sd3_pipeline import T5_LENGTH

from flowpost.core.conditions import ConditionBatch
from flowpost.core.models.edit_state import PooledEditState
from flowpost.core.models.flux1_kontext import Flux1KontextAdapter
from flowpost.core.models.pipeline_prompts import unmasked
from flowpost.core.models.registry import load_adapter
from flowpost.core.sampling.ode import sample_ode
from flowpost.errors import FlowpostError

INSTRUCTIONS = ["make it red", "turn the cat into a dog"]
STEPS = 3


@pytest.fixture(scope="module")
def adapter(flux1_kontext_pipeline_dir: Path) -> Flux1KontextAdapter:
    loaded = load_flux1_kontext_adapter(flux1_kontext_pipeline_dir)
    assert isinstance(loaded, Flux1KontextAdapter)
    return loaded


@pytest.fixture(scope="module")
def stock(flux1_kontext_pipeline_dir: Path) -> Any:
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline.from_pretrained(flux1_kontext_pipeline_dir)


@pytest.fixture(scope="module")
def text(stock: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The stock ``encode_prompt`` of the two instructions: T5 states and pooled CLIP vectors."""
    with torch.no_grad():
        embeds, pooled, _ = stock.encode_prompt(INSTRUCTIONS, prompt_2=None, max_sequence_length=T5_LENGTH)
    return embeds, pooled


def _state(adapter: Flux1KontextAdapter, embeds: torch.Tensor, pooled: torch.Tensor, grid: int = 4) -> Any:
    """Real text conditions with the seeded ``grid x grid`` source tokens, as a cached row holds them."""
    flat = seeded_kontext_states(INSTRUCTIONS[: len(embeds)], grid=grid).pooled[:, CLIP_WIDTH:]
    return adapter.prepare_condition_state(unmasked(embeds, torch.cat([pooled, flat], dim=1)))


def _noise(adapter: Flux1KontextAdapter, rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, *adapter.latent_shape, generator=torch.Generator().manual_seed(seed))


def _stock_latents(stock: Any, text: Any, noise: torch.Tensor, **options: Any) -> torch.Tensor:
    embeds, pooled = text
    return stock(
        prompt_embeds=embeds,
        pooled_prompt_embeds=pooled,
        image=seeded_kontext_latents(INSTRUCTIONS[: len(embeds)]),  # latents: the pipeline packs them as given
        latents=noise.clone(),
        height=RESOLUTION,
        width=RESOLUTION,
        max_area=RESOLUTION * RESOLUTION,
        num_inference_steps=STEPS,
        output_type="latent",
        **options,
    ).images


def test_the_registry_loads_the_folder_as_a_flux1_family(adapter, flux1_kontext_pipeline_dir) -> None:
    assert adapter.latent_shape == (4, 64)  # 4x4 latents of 16 channels, packed 2x2
    assert adapter.transformer.config.guidance_embeds and adapter.distilled_guidance == 3.5
    assert adapter.guidance_distilled and adapter.describe()["pretrained"]["path"] == str(flux1_kontext_pipeline_dir)
    assert adapter.source_side() == 1024 and adapter.condition_tokens == SOURCE_TOKENS


def test_the_ode_sampler_reproduces_the_stock_pipeline(adapter, stock, text) -> None:
    noise = _noise(adapter, 2)
    expected = _stock_latents(stock, text, noise)
    with torch.no_grad():
        latents = sample_ode(adapter, noise, _state(adapter, *text), adapter.inference_sigmas(STEPS))
    torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)


def test_true_cfg_reads_the_negative_with_each_rows_own_source(adapter, stock, text) -> None:
    noise = _noise(adapter, 2, seed=1)
    with torch.no_grad():
        negative_embeds, negative_pooled, _ = stock.encode_prompt(
            [""] * 2, prompt_2=None, max_sequence_length=T5_LENGTH
        )
    expected = _stock_latents(
        stock,
        text,
        noise,
        true_cfg_scale=2.0,
        negative_prompt_embeds=negative_embeds,
        negative_pooled_prompt_embeds=negative_pooled,
    )
    null_row = torch.cat([negative_pooled, torch.zeros(2, SOURCE_TOKENS * 64)], dim=1)  # the cached null prompt
    negative = adapter.prepare_condition_state(unmasked(negative_embeds, null_row))
    with torch.no_grad():
        sigmas = adapter.inference_sigmas(STEPS)
        latents = sample_ode(adapter, noise, _state(adapter, *text), sigmas, guidance=2.0, negative=negative)
    torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)


def test_the_source_tokens_steer_the_velocity_of_the_noisy_tokens_alone(adapter, text) -> None:
    state, noise = _state(adapter, *text), _noise(adapter, 2)
    swapped = PooledEditState(state.encoder_hidden_states, state.pooled_projections, state.source_latents.flip(0))
    with torch.no_grad():
        velocity = adapter.velocity(noise, torch.tensor(0.5), state)
        assert velocity.shape == noise.shape == (2, 4, 64)
        assert float((velocity - adapter.velocity(noise, torch.tensor(0.5), swapped)).abs().max()) > 1e-3
        rows = [adapter.velocity(noise[i : i + 1], torch.tensor(0.5), state.index([i])) for i in range(2)]
    torch.testing.assert_close(torch.cat(rows), velocity, rtol=0, atol=1e-5)


def test_cached_rows_without_a_square_source_grid_are_refused(adapter) -> None:
    batch = seeded_kontext_states(INSTRUCTIONS)
    with pytest.raises(ValueError, match="no square grid"):
        adapter.prepare_condition_state(ConditionBatch(batch.token_states, batch.token_mask, batch.pooled[:, :-64]))


def test_save_and_load_round_trip_the_family(adapter, flux1_kontext_pipeline_dir, text, tmp_path) -> None:
    tuned = load_flux1_kontext_adapter(flux1_kontext_pipeline_dir)
    tuned.add_lora(rank=2, alpha=2.0)
    with torch.no_grad():
        for name, param in tuned.module().named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    tuned.save_pretrained(tmp_path)
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, Flux1KontextAdapter) and loaded.resolution == RESOLUTION
    state, noise = _state(adapter, *text), _noise(adapter, 2)
    with torch.no_grad():
        velocities = [a.velocity(noise, torch.tensor(0.4), state) for a in (loaded, tuned, adapter)]
    torch.testing.assert_close(velocities[0], velocities[1], rtol=0, atol=1e-5)
    assert not torch.allclose(velocities[0], velocities[2])


def test_the_null_prompt_has_no_source_latents_and_a_missing_source_is_named(
    flux1_kontext_pipeline_dir: Path, tmp_path: Path
) -> None:
    from flowpost.core.conditions import NULL_PROMPT
    from flowpost.core.edit_prompts import edit_prompt
    from flowpost.core.models.edit_encoder import EditPrompts
    from flowpost.core.models.pretrained import PretrainedSource

    source = PretrainedSource(str(flux1_kontext_pipeline_dir))
    encoder = EditPrompts(Flux1KontextAdapter, source, T5_LENGTH, source_dirs=(tmp_path,))
    batch = encoder.encode([NULL_PROMPT])  # text only: no VAE pass
    assert batch.pooled.shape == (1, CLIP_WIDTH + SOURCE_TOKENS * 64)
    assert not bool(batch.pooled[:, CLIP_WIDTH:].any()) and bool(batch.pooled[:, :CLIP_WIDTH].any())
    with pytest.raises(FlowpostError, match=r"names source image 0{16}.*re-run the acquisition"):
        encoder.encode([edit_prompt("make it red", "0" * 16)])


def test_edits_of_several_sources_are_refused(flux1_kontext_pipeline_dir: Path, tmp_path: Path) -> None:
    from flowpost.core.edit_prompts import edit_prompt, source_file
    from flowpost.core.models.edit_encoder import EditPrompts
    from flowpost.core.models.pretrained import PretrainedSource

    digests = ("1" * 16, "2" * 16)
    for digest, image in zip(digests, random_sources(), strict=True):
        source_file(tmp_path, digest).parent.mkdir(exist_ok=True)
        image.save(source_file(tmp_path, digest))
    source = PretrainedSource(str(flux1_kontext_pipeline_dir))
    encoder = EditPrompts(Flux1KontextAdapter, source, T5_LENGTH, source_dirs=(tmp_path,), sources=2)
    with pytest.raises(FlowpostError, match=r"flux1-kontext reads one source image per edit; .* name 2") as info:
        encoder.encode([edit_prompt("put the cat on the car", *digests)])
    assert info.value.where == "conditions"


def test_the_memory_preflight_counts_the_source_tokens(adapter) -> None:
    from flowpost.core.models.footprint import model_footprint

    assert model_footprint(adapter).image_tokens == adapter.latent_shape[0] + SOURCE_TOKENS


@pytest.mark.slow
def test_conditions_and_sampling_from_source_images_match_the_stock_pipeline(adapter, stock) -> None:
    image = random_sources()[0]
    state = adapter.prepare_condition_state(adapter.encode_edits(INSTRUCTIONS, random_sources()))
    assert state.source_latents.shape == (2, SOURCE_TOKENS, 64) and state.source_grid == 32
    assert not torch.allclose(state.source_latents[0], state.source_latents[1])
    noise = _noise(adapter, 1)
    expected = stock(
        image=image,
        prompt=INSTRUCTIONS[0],
        latents=noise.clone(),
        height=RESOLUTION,
        width=RESOLUTION,
        max_area=RESOLUTION * RESOLUTION,
        num_inference_steps=STEPS,
        max_sequence_length=T5_LENGTH,
        output_type="latent",
    ).images
    with torch.no_grad():
        latents = sample_ode(adapter, noise, state.index([0]), adapter.inference_sigmas(STEPS))
    torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)


def _example(folder: Path, **options: Any) -> dict[str, Any]:
    """``examples/flux1-kontext.yaml`` on a local folder, its SFT stage's options replaced."""
    import yaml

    config = yaml.safe_load((Path(__file__).parents[3] / "examples" / "flux1-kontext.yaml").read_text())
    config["conditions"]["kontext"]["model"]["pretrained"] = str(folder)
    for stage in config["stages"].values():
        stage["model"]["pretrained"] = str(folder)
    config["stages"]["sft"]["model"]["options"] = options
    return config


def test_validation_names_each_bad_setting(flux1_kontext_pipeline_dir: Path, flux1_pipeline_dir: Path) -> None:
    from flowpost.core.config.loading import validate_pipeline

    validate_pipeline(_example(flux1_kontext_pipeline_dir, resolution=RESOLUTION))
    refused = {
        "resolution": (100, r"stages\.sft\.model\.options\.resolution: .*multiple of 16"),
        "distilled_guidance": ("high", r"stages\.sft\.model\.options\.distilled_guidance: .*give a number"),
        "true_cfg": (2.0, r"stages\.sft\.model\.options: family 'flux1-kontext' has no option true_cfg"),
    }
    for option, (value, message) in refused.items():
        with pytest.raises(FlowpostError, match=message):
            validate_pipeline(_example(flux1_kontext_pipeline_dir, **{option: value}))
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model\.pretrained: .*FluxPipeline.*FluxKontextPipeline"):
        validate_pipeline(_example(flux1_pipeline_dir))
