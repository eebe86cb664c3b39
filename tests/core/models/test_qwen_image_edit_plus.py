"""The qwen-image-edit-plus family against the stock diffusers ``QwenImageEditPlusPipeline``, on a tiny random
folder: two sources per edit, each read by Qwen2.5-VL at 384 x 384 pixels after its ``Picture N:`` label and
VAE-encoded at 1024 x 1024 (seconds on a CPU: those tests are slow; the others run on seeded conditions)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from edit_pairs import random_sources
from tiny_qwen_image_edit_pipeline import (
    MAX_LENGTH,
    PLUS_SOURCES,
    RESOLUTION,
    SOURCE_TOKENS,
    load_qwen_image_edit_plus_adapter,
    load_stock_edit_pipeline,
    seeded_plus_states,
)

from flowpost.core.models.edit_state import EditState
from flowpost.core.models.qwen_image_edit_plus import QwenImageEditPlusAdapter
from flowpost.core.models.registry import load_adapter
from flowpost.core.sampling.ode import sample_ode
from flowpost.errors import FlowpostError

PLUS = "QwenImageEditPlusPipeline"
INSTRUCTIONS = ["put the cat from picture 1 on the car of picture 2", "swap the two colours"]


@pytest.fixture(scope="module")
def adapter(qwen_image_edit_plus_pipeline_dir: Path) -> QwenImageEditPlusAdapter:
    loaded = load_qwen_image_edit_plus_adapter(qwen_image_edit_plus_pipeline_dir)
    assert isinstance(loaded, QwenImageEditPlusAdapter) and loaded.sources == PLUS_SOURCES
    return loaded


@pytest.fixture(scope="module")
def seeded(adapter: QwenImageEditPlusAdapter) -> EditState:
    """Seeded conditions of two edits: 5 token states (the second row padded) and two 4x4 source grids each."""
    return adapter.prepare_condition_state(seeded_plus_states(INSTRUCTIONS))


def _noise(adapter: QwenImageEditPlusAdapter, rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, *adapter.latent_shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow
def test_conditions_and_the_ode_sampler_reproduce_the_stock_edit_plus_pipeline(
    adapter: QwenImageEditPlusAdapter, qwen_image_edit_plus_pipeline_dir: Path
) -> None:
    stock = load_stock_edit_pipeline(qwen_image_edit_plus_pipeline_dir, PLUS)
    images = [random_sources(PLUS_SOURCES, seed=0), random_sources(PLUS_SOURCES, seed=1)]
    state = adapter.prepare_condition_state(adapter.encode_edits(INSTRUCTIONS, images))
    assert state.source_latents.shape == (2, PLUS_SOURCES * SOURCE_TOKENS, 64) and state.source_grid == 32
    first, second = (state.source_latents[0, i * SOURCE_TOKENS : (i + 1) * SOURCE_TOKENS] for i in range(2))
    assert not torch.allclose(first, second)  # each source its own latents, in order
    embeds, _ = stock.encode_prompt(
        INSTRUCTIONS[:1], image=[stock.image_processor.resize(image, 384, 384) for image in images[0]]
    )
    row = state.index([0])
    torch.testing.assert_close(row.encoder_hidden_states[:, : embeds.shape[1]], embeds, rtol=0, atol=1e-5)

    noise, sigmas = _noise(adapter, 2), adapter.inference_sigmas(3)
    expected = stock(
        image=images[0],
        prompt=INSTRUCTIONS[0],
        latents=noise[:1].clone(),
        height=RESOLUTION,
        width=RESOLUTION,
        num_inference_steps=3,
        max_sequence_length=MAX_LENGTH,
        output_type="latent",
    ).images
    latents = sample_ode(adapter, noise, state, sigmas)
    torch.testing.assert_close(latents[:1], expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(latents[1:], sample_ode(adapter, noise[1:], state.index([1]), sigmas), rtol=0, atol=1e-5)


def test_every_source_steers_the_velocity_of_the_noisy_tokens(adapter, seeded) -> None:
    noise, grid = _noise(adapter, 2), seeded.source_grid**2
    assert seeded.sources == PLUS_SOURCES and seeded.source_latents.shape == (2, PLUS_SOURCES * grid, 64)
    second = seeded.source_latents.clone()
    second[:, grid:] = second[:, grid:].flip(0)  # the second source swapped between the rows, the first kept
    swapped = EditState(seeded.encoder_hidden_states, seeded.encoder_attention_mask, second, PLUS_SOURCES)
    with torch.no_grad():
        velocity = adapter.velocity(noise, torch.tensor(0.5), seeded)
        assert velocity.shape == noise.shape == (2, 4, 64)
        assert float((velocity - adapter.velocity(noise, torch.tensor(0.5), swapped)).abs().max()) > 1e-3
        rows = [adapter.velocity(noise[i : i + 1], torch.tensor(0.5), seeded.index([i])) for i in range(2)]
    torch.testing.assert_close(torch.cat(rows), velocity, rtol=0, atol=1e-5)


def test_rows_of_another_number_of_sources_are_refused(adapter) -> None:
    batch = seeded_plus_states(INSTRUCTIONS)
    with pytest.raises(ValueError, match=r"no 2 square grids of 64-channel"):
        adapter.prepare_condition_state(type(batch)(batch.token_states, batch.token_mask, batch.pooled[:, :-64]))


def test_a_bad_number_of_sources_is_refused_with_the_setting_named(qwen_image_edit_plus_pipeline_dir) -> None:
    with pytest.raises(FlowpostError, match=r"model\.options\.sources.*positive number"):
        load_qwen_image_edit_plus_adapter(qwen_image_edit_plus_pipeline_dir, sources=0)


def test_the_export_round_trips_and_its_lora_loads_into_the_stock_pipeline(
    qwen_image_edit_plus_pipeline_dir: Path, seeded: EditState, tmp_path: Path
) -> None:
    from peft.utils import get_peft_model_state_dict

    tuned = load_qwen_image_edit_plus_adapter(qwen_image_edit_plus_pipeline_dir)
    tuned.add_lora(rank=2, alpha=2.0)
    with torch.no_grad():
        for name, param in tuned.module().named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    tuned.save_pretrained(tmp_path)
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, QwenImageEditPlusAdapter) and loaded.sources == PLUS_SOURCES
    noise = _noise(tuned, 2)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.velocity(noise, torch.tensor(0.4), seeded), tuned.velocity(noise, torch.tensor(0.4), seeded)
        )
    stock = load_stock_edit_pipeline(qwen_image_edit_plus_pipeline_dir, PLUS)
    stock.load_lora_weights(tmp_path / "lora")
    [name] = stock.transformer.peft_config
    exported = get_peft_model_state_dict(stock.transformer, adapter_name=name)
    trained = get_peft_model_state_dict(tuned.module())
    assert exported.keys() == trained.keys() and exported
    for key, value in trained.items():
        torch.testing.assert_close(exported[key], value, msg=key)


def test_the_null_prompt_has_zero_latents_of_every_source_and_a_prompt_must_name_them_all(
    qwen_image_edit_plus_pipeline_dir: Path, tmp_path: Path
) -> None:
    from flowpost.core.conditions import NULL_PROMPT
    from flowpost.core.edit_prompts import edit_prompt
    from flowpost.core.models.edit_encoder import EditPrompts
    from flowpost.core.models.pretrained import PretrainedSource

    source = PretrainedSource(str(qwen_image_edit_plus_pipeline_dir))
    encoder = EditPrompts(QwenImageEditPlusAdapter, source, MAX_LENGTH, source_dirs=(tmp_path,), sources=2)
    batch = encoder.encode([NULL_PROMPT])  # two black squares read by Qwen2.5-VL only: no VAE pass
    assert batch.pooled.shape == (1, PLUS_SOURCES * SOURCE_TOKENS * 64) and not bool(batch.pooled.any())
    with pytest.raises(FlowpostError, match=r"names 1 source image\(s\); qwen-image-edit-plus reads 2 here"):
        encoder.encode([edit_prompt("make it red", "0" * 16)])


def test_validation_names_a_bad_number_of_sources_in_the_pipeline_file(qwen_image_edit_plus_pipeline_dir) -> None:
    import yaml

    from flowpost.core.config.loading import validate_pipeline

    config = yaml.safe_load((Path(__file__).parents[3] / "examples" / "qwen-image-edit.yaml").read_text())
    for model in (config["conditions"]["qwen"]["model"], *(stage["model"] for stage in config["stages"].values())):
        model.update(family="qwen-image-edit-plus", pretrained=str(qwen_image_edit_plus_pipeline_dir))
    config["stages"]["sft"]["model"]["options"]["sources"] = 0
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model\.options\.sources.*positive number"):
        validate_pipeline(config)
