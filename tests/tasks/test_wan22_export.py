"""A wan22-a14b export's LoRA folders, transformer folders and pipeline folder load in the stock ``WanPipeline``
(both experts) and generate the videos flowpost's sampler makes from the trained weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_lora_export import _export, _perturbed_lora
from tiny_sd3_pipeline import T5_LENGTH
from tiny_wan2_pipeline import FRAMES, HEIGHT, WIDTH, load_wan2_adapter

from flowpost.core.sampling.ode import sample_ode

PROMPTS = ["a red cat", "a blue dog on a car"]
STEPS, GUIDANCE, LOW_NOISE_GUIDANCE = 4, 5.0, 3.0


@pytest.fixture(scope="module")
def wan22_export(wan22_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    options = {"low_noise_guidance": LOW_NOISE_GUIDANCE}
    adapter = _perturbed_lora(load_wan2_adapter(wan22_pipeline_dir, family="wan22-a14b", options=options))
    return adapter, _export(adapter, tmp_path_factory.mktemp("wan22-export"), ("diffusers", "pipeline"))


def _stock(route: str, export: Path, pretrained: Path) -> Any:
    """The stock pipeline with both LoRA folders, or both transformer folders, or the export folder itself."""
    from diffusers import DiffusionPipeline, WanPipeline, WanTransformer3DModel

    if route == "lora":
        pipe = WanPipeline.from_pretrained(pretrained)
        pipe.load_lora_weights(export / "lora")
        pipe.load_lora_weights(export / "lora_2", load_into_transformer_2=True)
    elif route == "transformer":
        experts = {
            name: WanTransformer3DModel.from_pretrained(export / name) for name in ("transformer", "transformer_2")
        }
        pipe = WanPipeline.from_pretrained(pretrained, **experts)
    else:
        pipe = DiffusionPipeline.from_pretrained(export)
    assert isinstance(pipe, WanPipeline) and pipe.config.boundary_ratio is not None
    return pipe


def _stock_latents(pipe: Any, noise: torch.Tensor) -> torch.Tensor:
    size = {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES, "max_sequence_length": T5_LENGTH}
    guidance = {"guidance_scale": GUIDANCE, "guidance_scale_2": LOW_NOISE_GUIDANCE}
    return pipe(
        PROMPTS, latents=noise.clone(), num_inference_steps=STEPS, output_type="latent", **size, **guidance
    ).frames


@pytest.mark.parametrize("route", ["lora", "transformer", "pipeline"])
def test_the_stock_pipeline_generates_what_flowpost_samples(wan22_export, wan22_pipeline_dir: Path, route) -> None:
    from diffusers import WanPipeline

    adapter, export = wan22_export
    noise = torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(0))
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0, 0]))
    with torch.no_grad():
        expected = sample_ode(
            adapter, noise, state, adapter.inference_sigmas(STEPS), guidance=GUIDANCE, negative=negative
        )
    torch.testing.assert_close(
        _stock_latents(_stock(route, export, wan22_pipeline_dir), noise), expected, rtol=0, atol=1e-5
    )
    untrained = _stock_latents(WanPipeline.from_pretrained(wan22_pipeline_dir), noise)
    assert not torch.allclose(untrained, expected, atol=1e-3)  # the LoRA changed what is generated


def test_the_model_card_names_both_experts_folders(wan22_export) -> None:
    _, export = wan22_export
    card = (export / "README.md").read_text()
    assert "`transformer_2/`" in card and 'pipe.load_lora_weights("lora_2", load_into_transformer_2=True)' in card
    assert {"lora", "lora_2", "transformer", "transformer_2"} <= {p.name for p in export.iterdir()}
