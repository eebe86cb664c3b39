"""A wan2 export's LoRA, transformer and pipeline folders load in the stock ``WanPipeline`` and generate the
videos flowpost's sampler makes from the trained weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_lora_export import _export, _perturbed_lora, _stock_pipeline
from tiny_sd3_pipeline import T5_LENGTH
from tiny_wan2_pipeline import FRAMES, HEIGHT, WIDTH, load_wan2_adapter

from flowpost.core.sampling.ode import sample_ode

PROMPTS = ["a red cat", "a blue dog on a car"]
STEPS, GUIDANCE = 3, 5.0


@pytest.fixture(scope="module")
def wan2_export(wan2_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    adapter = _perturbed_lora(load_wan2_adapter(wan2_pipeline_dir))
    return adapter, _export(adapter, tmp_path_factory.mktemp("wan2-export"), ("diffusers", "pipeline"))


def _stock_latents(pipe: Any, noise: torch.Tensor) -> torch.Tensor:
    size = {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES}
    options = {"num_inference_steps": STEPS, "guidance_scale": GUIDANCE, "max_sequence_length": T5_LENGTH}
    return pipe(PROMPTS, latents=noise.clone(), output_type="latent", **size, **options).frames


@pytest.mark.parametrize("route", ["lora", "transformer", "pipeline"])
def test_the_stock_wan_pipeline_generates_what_flowpost_samples(wan2_export, wan2_pipeline_dir: Path, route) -> None:
    from diffusers import WanPipeline, WanTransformer3DModel

    adapter, export = wan2_export
    pipe = _stock_pipeline(route, export, wan2_pipeline_dir, WanPipeline, WanTransformer3DModel)
    noise = torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(0))
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0, 0]))
    with torch.no_grad():
        expected = sample_ode(
            adapter, noise, state, adapter.inference_sigmas(STEPS), guidance=GUIDANCE, negative=negative
        )
    torch.testing.assert_close(_stock_latents(pipe, noise), expected, rtol=0, atol=1e-5)
    untrained = _stock_latents(WanPipeline.from_pretrained(wan2_pipeline_dir), noise)
    assert not torch.allclose(untrained, expected, atol=1e-3)  # the LoRA changed what is generated


def test_the_model_card_names_the_video_folders_and_an_mp4_sample(wan2_export) -> None:
    _, export = wan2_export
    card = (export / "README.md").read_text()
    assert 'pipe.load_lora_weights("lora")' in card and "WanTransformer3DModel.from_pretrained" in card
    assert "--out sample.mp4" in card and not (export / "lora_base").exists()
