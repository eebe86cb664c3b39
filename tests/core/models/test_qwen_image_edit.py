"""The qwen-image-edit family against the stock diffusers ``QwenImageEditPipeline``, on a tiny random folder.

The stock pipeline reads every source at 1024 x 1024 pixels, which the tiny VAE encodes in seconds on a CPU:
the tests that encode sources are slow; the others run on seeded conditions with a small source grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from edit_pairs import random_sources
from tiny_qwen_image_edit_pipeline import (
    MAX_LENGTH,
    RESOLUTION,
    SOURCE_TOKENS,
    load_qwen_image_edit_adapter,
    load_stock_edit_pipeline,
    seeded_edit_states,
)

from flowpost.core.models.edit_state import EditState
from flowpost.core.models.qwen_image_edit import QwenImageEditAdapter
from flowpost.core.models.registry import load_adapter
from flowpost.core.sampling.ode import sample_ode
from flowpost.errors import FlowpostError

INSTRUCTIONS = ["make it red", "turn the cat into a dog"]


@pytest.fixture(scope="module")
def adapter(qwen_image_edit_pipeline_dir: Path) -> QwenImageEditAdapter:
    loaded = load_qwen_image_edit_adapter(qwen_image_edit_pipeline_dir)
    assert isinstance(loaded, QwenImageEditAdapter)
    return loaded


@pytest.fixture(scope="module")
def stock(qwen_image_edit_pipeline_dir: Path) -> Any:
    return load_stock_edit_pipeline(qwen_image_edit_pipeline_dir)


@pytest.fixture(scope="module")
def state(adapter: QwenImageEditAdapter) -> EditState:
    """The stock conditions of the two edits (1024 px sources: seconds)."""
    return adapter.prepare_condition_state(adapter.encode_edits(INSTRUCTIONS, random_sources()))


@pytest.fixture(scope="module")
def seeded(adapter: QwenImageEditAdapter) -> EditState:
    """Seeded conditions of two edits: 5 token states (the second row padded) and 4x4 source tokens."""
    return adapter.prepare_condition_state(seeded_edit_states(INSTRUCTIONS))


def _noise(adapter: QwenImageEditAdapter, rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, *adapter.latent_shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow
def test_conditions_hold_the_instruction_read_with_the_source_and_its_latents(adapter, stock, state) -> None:
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

    image = random_sources()[0]
    width, height, _ = calculate_dimensions(1024 * 1024, 1.0)
    resized = stock.image_processor.resize(image, height, width)
    embeds, _ = stock.encode_prompt(INSTRUCTIONS[:1], image=resized)
    pixels = stock.image_processor.preprocess(resized, height, width).unsqueeze(2)
    latents = stock._encode_vae_image(pixels, generator=None)
    packed = stock._pack_latents(latents, 1, 16, *latents.shape[3:])
    assert state.source_latents.shape == (2, SOURCE_TOKENS, 64) and state.source_grid == 32
    torch.testing.assert_close(state.source_latents[:1], packed, rtol=0, atol=1e-5)
    assert not torch.allclose(state.source_latents[0], state.source_latents[1])
    row = state.index([0])
    torch.testing.assert_close(row.encoder_hidden_states[:, : embeds.shape[1]], embeds, rtol=0, atol=1e-5)
    other = adapter.prepare_condition_state(adapter.encode_edits(INSTRUCTIONS[:1], random_sources(2)[1:]))
    assert not torch.allclose(other.encoder_hidden_states, row.encoder_hidden_states[:, : embeds.shape[1]])


@pytest.mark.slow
def test_the_ode_sampler_reproduces_the_stock_edit_pipeline(adapter, stock, state) -> None:
    noise, sigmas = _noise(adapter, 2), adapter.inference_sigmas(3)
    expected = stock(  # the first edit, padded in the batch below
        image=random_sources()[0],
        prompt=INSTRUCTIONS[0],
        latents=noise[:1].clone(),
        height=RESOLUTION,
        width=RESOLUTION,
        num_inference_steps=3,
        max_sequence_length=MAX_LENGTH,
        output_type="latent",
    ).images
    assert state.mask() is not None and not bool(state.mask()[0].all())
    latents = sample_ode(adapter, noise, state, sigmas)
    torch.testing.assert_close(latents[:1], expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(latents[1:], sample_ode(adapter, noise[1:], state.index([1]), sigmas), rtol=0, atol=1e-5)


def test_the_source_tokens_steer_the_velocity_of_the_noisy_tokens_alone(adapter, seeded) -> None:
    noise = _noise(adapter, 2)
    swapped = EditState(seeded.encoder_hidden_states, seeded.encoder_attention_mask, seeded.source_latents.flip(0))
    with torch.no_grad():
        velocity = adapter.velocity(noise, torch.tensor(0.5), seeded)
        assert velocity.shape == noise.shape == (2, 4, 64)
        assert float((velocity - adapter.velocity(noise, torch.tensor(0.5), swapped)).abs().max()) > 1e-3
        rows = [adapter.velocity(noise[i : i + 1], torch.tensor(0.5), seeded.index([i])) for i in range(2)]
    torch.testing.assert_close(torch.cat(rows), velocity, rtol=0, atol=1e-5)  # the padded mask changes nothing


def test_cached_rows_of_another_width_are_refused(adapter) -> None:
    batch = seeded_edit_states(INSTRUCTIONS)
    with pytest.raises(ValueError, match="no square grid"):
        adapter.prepare_condition_state(type(batch)(batch.token_states, batch.token_mask, batch.pooled[:, :-64]))


def test_guidance_is_refused_with_the_setting_named(adapter, seeded) -> None:
    with pytest.raises(FlowpostError, match=r"sampling\.guidance.*set guidance to 1"):
        adapter.forward(_noise(adapter, 2), torch.tensor(0.5), seeded, guidance=4.0, negative=seeded)


def test_save_and_load_round_trip_the_family(adapter, qwen_image_edit_pipeline_dir, seeded, tmp_path) -> None:
    tuned = load_qwen_image_edit_adapter(qwen_image_edit_pipeline_dir)
    tuned.add_lora(rank=2, alpha=2.0)
    with torch.no_grad():
        for name, param in tuned.module().named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    tuned.save_pretrained(tmp_path)
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, QwenImageEditAdapter) and loaded.resolution == RESOLUTION
    noise = _noise(adapter, 2)
    with torch.no_grad():
        velocities = [a.velocity(noise, torch.tensor(0.4), seeded) for a in (loaded, tuned, adapter)]
    torch.testing.assert_close(velocities[0], velocities[1], rtol=0, atol=1e-5)
    assert not torch.allclose(velocities[0], velocities[2])


def test_validation_refuses_guidance_for_the_edit_family_naming_each_setting() -> None:
    import yaml

    from flowpost.core.config.loading import validate_pipeline

    config = yaml.safe_load((Path(__file__).parents[3] / "examples" / "qwen-image-edit.yaml").read_text())
    config["stages"]["grpo"]["sampling"]["guidance"] = 4.0
    config["evaluate"] = {"after": ["sft"], "guidance": 2.5, "metrics": ["brightness"]}
    with pytest.raises(
        FlowpostError, match=r"evaluate\.guidance: family 'qwen-image-edit' .* set it to 1 \(got 2\.5\)"
    ):
        validate_pipeline(config)
    config["evaluate"]["guidance"] = 1.0
    with pytest.raises(FlowpostError, match=r"stages\.grpo\.sampling\.guidance: .*without classifier-free guidance"):
        validate_pipeline(config)


def test_the_null_prompt_has_no_source_latents_and_a_missing_source_is_named(
    qwen_image_edit_pipeline_dir: Path, tmp_path: Path
) -> None:
    from flowpost.core.conditions import NULL_PROMPT
    from flowpost.core.edit_prompts import edit_prompt
    from flowpost.core.models.edit_encoder import EditPrompts
    from flowpost.core.models.pretrained import PretrainedSource

    source = PretrainedSource(str(qwen_image_edit_pipeline_dir))
    encoder = EditPrompts(QwenImageEditAdapter, source, MAX_LENGTH, source_dirs=(tmp_path,))
    batch = encoder.encode([NULL_PROMPT])  # the black square is read by Qwen2.5-VL only: no VAE pass
    assert batch.pooled.shape == (1, SOURCE_TOKENS * 64) and not bool(batch.pooled.any())
    assert bool(batch.token_states.abs().sum() > 0)
    with pytest.raises(FlowpostError, match=r"names source image 0{16}.*re-run the acquisition"):
        encoder.encode([edit_prompt("make it red", "0" * 16)])


def test_the_memory_preflight_counts_the_source_tokens(adapter) -> None:
    from flowpost.core.models.footprint import model_footprint

    assert adapter.condition_tokens == SOURCE_TOKENS
    assert model_footprint(adapter).image_tokens == adapter.latent_shape[0] + SOURCE_TOKENS
