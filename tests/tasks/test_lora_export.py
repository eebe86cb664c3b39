"""The export's LoRA, transformer and pipeline folders load in stock diffusers and generate as flowpost does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_flux1_kontext_pipeline import RESOLUTION as KONTEXT_RESOLUTION
from tiny_flux1_kontext_pipeline import load_flux1_kontext_adapter, seeded_kontext_latents
from tiny_flux1_pipeline import RESOLUTION, load_flux1_adapter
from tiny_flux2_pipeline import DEV_MAX_LENGTH, KLEIN_MAX_LENGTH, load_flux2_adapter, load_flux2_klein_adapter
from tiny_qwen_image_pipeline import MAX_LENGTH as QWEN_IMAGE_MAX_LENGTH
from tiny_qwen_image_pipeline import RESOLUTION as QWEN_IMAGE_RESOLUTION
from tiny_qwen_image_pipeline import load_qwen_image_adapter
from tiny_sd3_pipeline import T5_LENGTH, load_sd3_adapter
from tiny_z_image_pipeline import MAX_LENGTH as Z_IMAGE_MAX_LENGTH
from tiny_z_image_pipeline import RESOLUTION as Z_IMAGE_RESOLUTION
from tiny_z_image_pipeline import load_z_image_adapter

from flowpost.core.io import write_json_atomic
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.models.transformer_adapter import TransformerAdapter
from flowpost.core.sampling.ode import sample_ode
from flowpost.tasks.export import export_stage

PROMPTS = ["a red cat", "a blue dog on a car"]
STEPS, GUIDANCE = 4, 4.5


def _perturbed_lora(adapter: TransformerAdapter) -> TransformerAdapter:
    """LoRA with alpha != rank (the scale must travel in the export) and nonzero B, as after training."""
    adapter.add_lora(rank=2, alpha=6.0)
    with torch.no_grad():
        for name, param in adapter.module().named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    return adapter


def _export(adapter: TransformerAdapter, tmp_path: Path, formats: tuple[str, ...] = ("diffusers",)) -> Path:
    train_dir, out = tmp_path / "train", tmp_path / "export"
    adapter.save_pretrained(train_dir / "final" / "live")
    write_json_atomic(train_dir / "final" / "progress.json", {"optimizer_step": 1})
    out.mkdir()
    config = {"name": "lora-export"}
    export_stage(
        stage="s",
        train_dir=train_dir,
        out_dir=out,
        weights="live",
        resolved_config=config,
        fingerprints={},
        formats=formats,
    )
    return out


@pytest.fixture(scope="module")
def sd3_export(sd3_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    adapter = _perturbed_lora(load_sd3_adapter(sd3_pipeline_dir))
    return adapter, _export(adapter, tmp_path_factory.mktemp("sd3-export"), ("diffusers", "pipeline"))


def _flowpost_latents(adapter: Any, noise: torch.Tensor) -> torch.Tensor:
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0, 0]))
    with torch.no_grad():
        sigmas = adapter.inference_sigmas(STEPS)
        return sample_ode(adapter, noise, state, sigmas, guidance=GUIDANCE, negative=negative)


def _stock_latents(pipe: Any, noise: torch.Tensor) -> torch.Tensor:
    options = {"num_inference_steps": STEPS, "guidance_scale": GUIDANCE, "max_sequence_length": T5_LENGTH}
    return pipe(PROMPTS, latents=noise.clone(), output_type="latent", **options).images


def _noise(adapter: Any) -> torch.Tensor:
    return torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(0))


def _stock_pipeline(route: str, export: Path, pretrained: Path, pipeline_class: Any, transformer_class: Any) -> Any:
    """The stock pipeline with the export's ``lora/``, or its ``transformer/``, or the export folder itself."""
    from diffusers import DiffusionPipeline

    if route == "lora":
        pipe = pipeline_class.from_pretrained(pretrained)
        pipe.load_lora_weights(export / "lora")
    elif route == "transformer":
        transformer = transformer_class.from_pretrained(export / "transformer")
        pipe = pipeline_class.from_pretrained(pretrained, transformer=transformer)
    else:
        pipe = DiffusionPipeline.from_pretrained(export)
    assert isinstance(pipe, pipeline_class)
    return pipe


@pytest.mark.parametrize("route", ["lora", "transformer", "pipeline"])
def test_the_stock_sd3_pipeline_generates_what_flowpost_samples(sd3_export, sd3_pipeline_dir: Path, route) -> None:
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    adapter, export = sd3_export
    pipe = _stock_pipeline(route, export, sd3_pipeline_dir, StableDiffusion3Pipeline, SD3Transformer2DModel)
    noise = _noise(adapter)
    expected = _flowpost_latents(adapter, noise)
    torch.testing.assert_close(_stock_latents(pipe, noise), expected, rtol=0, atol=1e-5)
    untrained = _stock_latents(StableDiffusion3Pipeline.from_pretrained(sd3_pipeline_dir), noise)
    assert not torch.allclose(untrained, expected, atol=1e-3)  # the LoRA changed what is generated


@pytest.fixture(scope="module")
def flux1_export(flux1_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    adapter = _perturbed_lora(load_flux1_adapter(flux1_pipeline_dir))
    return adapter, _export(adapter, tmp_path_factory.mktemp("flux1-export"), ("diffusers", "pipeline"))


def _stock_flux1_latents(pipe: Any, noise: torch.Tensor, distilled_guidance: float) -> torch.Tensor:
    options = {"num_inference_steps": STEPS, "guidance_scale": distilled_guidance, "max_sequence_length": T5_LENGTH}
    size = {"height": RESOLUTION, "width": RESOLUTION}
    return pipe(PROMPTS, latents=noise.clone(), output_type="latent", **size, **options).images


@pytest.mark.parametrize("route", ["lora", "transformer", "pipeline"])
def test_the_stock_flux_pipeline_generates_what_flowpost_samples(flux1_export, flux1_pipeline_dir, route) -> None:
    from diffusers import FluxPipeline, FluxTransformer2DModel

    adapter, export = flux1_export
    pipe = _stock_pipeline(route, export, flux1_pipeline_dir, FluxPipeline, FluxTransformer2DModel)
    noise = _noise(adapter)
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    with torch.no_grad():  # the distilled guidance only: no true CFG, as the stock pipeline by default
        expected = sample_ode(adapter, noise, state, adapter.inference_sigmas(STEPS))
    torch.testing.assert_close(
        _stock_flux1_latents(pipe, noise, adapter.distilled_guidance), expected, rtol=0, atol=1e-5
    )
    untrained = _stock_flux1_latents(
        FluxPipeline.from_pretrained(flux1_pipeline_dir), noise, adapter.distilled_guidance
    )
    assert not torch.allclose(untrained, expected, atol=1e-3)  # the LoRA changed what is generated


@pytest.fixture(scope="module")
def flux1_kontext_export(
    flux1_kontext_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Path]:
    adapter = _perturbed_lora(load_flux1_kontext_adapter(flux1_kontext_pipeline_dir))
    return adapter, _export(adapter, tmp_path_factory.mktemp("flux1-kontext-export"), ("diffusers", "pipeline"))


def _stock_kontext_latents(pipe: Any, noise: torch.Tensor, distilled_guidance: float) -> torch.Tensor:
    options = {"num_inference_steps": STEPS, "guidance_scale": distilled_guidance, "max_sequence_length": T5_LENGTH}
    size = {"height": KONTEXT_RESOLUTION, "width": KONTEXT_RESOLUTION, "max_area": KONTEXT_RESOLUTION**2}
    sources = seeded_kontext_latents(PROMPTS)  # source latents, which the pipeline packs as given
    return pipe(image=sources, prompt=PROMPTS, latents=noise.clone(), output_type="latent", **size, **options).images


@pytest.mark.parametrize("route", ["lora", "transformer", "pipeline"])
def test_the_stock_kontext_pipeline_edits_as_flowpost_samples(flux1_kontext_export, flux1_kontext_pipeline_dir, route):
    from diffusers import FluxKontextPipeline, FluxTransformer2DModel

    from flowpost.core.models.pipeline_prompts import unmasked

    adapter, export = flux1_kontext_export
    pipe = _stock_pipeline(route, export, flux1_kontext_pipeline_dir, FluxKontextPipeline, FluxTransformer2DModel)
    noise = _noise(adapter)
    untrained = FluxKontextPipeline.from_pretrained(flux1_kontext_pipeline_dir)
    embeds, pooled, _ = untrained.encode_prompt(PROMPTS, prompt_2=None, max_sequence_length=T5_LENGTH)
    sources = untrained._pack_latents(seeded_kontext_latents(PROMPTS), len(PROMPTS), 16, 8, 8).flatten(1)
    state = adapter.prepare_condition_state(unmasked(embeds, torch.cat([pooled, sources], dim=1)))
    with torch.no_grad():  # the distilled guidance only: no true CFG, as the stock pipeline by default
        expected = sample_ode(adapter, noise, state, adapter.inference_sigmas(STEPS))
    guidance = adapter.distilled_guidance
    torch.testing.assert_close(_stock_kontext_latents(pipe, noise, guidance), expected, rtol=0, atol=1e-5)
    assert not torch.allclose(_stock_kontext_latents(untrained, noise, guidance), expected, atol=1e-3)


@pytest.fixture(scope="module")
def qwen_image_export(qwen_image_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    adapter = _perturbed_lora(load_qwen_image_adapter(qwen_image_pipeline_dir))
    return adapter, _export(adapter, tmp_path_factory.mktemp("qwen-image-export"), ("diffusers", "pipeline"))


def _stock_qwen_image_latents(pipe: Any, noise: torch.Tensor) -> torch.Tensor:
    options = {"num_inference_steps": STEPS, "true_cfg_scale": GUIDANCE, "max_sequence_length": QWEN_IMAGE_MAX_LENGTH}
    inputs = {"height": QWEN_IMAGE_RESOLUTION, "width": QWEN_IMAGE_RESOLUTION, "negative_prompt": [""] * len(PROMPTS)}
    return pipe(PROMPTS, latents=noise.clone(), output_type="latent", **inputs, **options).images


@pytest.mark.parametrize("route", ["lora", "transformer", "pipeline"])
def test_the_stock_qwen_pipeline_generates_what_flowpost_samples(qwen_image_export, qwen_image_pipeline_dir, route):
    from diffusers import QwenImagePipeline, QwenImageTransformer2DModel

    adapter, export = qwen_image_export
    pipe = _stock_pipeline(route, export, qwen_image_pipeline_dir, QwenImagePipeline, QwenImageTransformer2DModel)
    noise = _noise(adapter)
    expected = _flowpost_latents(adapter, noise)  # true CFG with the norm rescale, as the stock pipeline
    torch.testing.assert_close(_stock_qwen_image_latents(pipe, noise), expected, rtol=0, atol=1e-5)
    untrained = _stock_qwen_image_latents(QwenImagePipeline.from_pretrained(qwen_image_pipeline_dir), noise)
    assert not torch.allclose(untrained, expected, atol=1e-3)  # the LoRA changed what is generated


@pytest.fixture(scope="module")
def z_image_export(z_image_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    adapter = _perturbed_lora(load_z_image_adapter(z_image_pipeline_dir))
    return adapter, _export(adapter, tmp_path_factory.mktemp("z-image-export"), ("diffusers", "pipeline"))


def _stock_z_image_latents(pipe: Any, noise: torch.Tensor) -> torch.Tensor:
    options = {"num_inference_steps": STEPS, "guidance_scale": GUIDANCE - 1, "max_sequence_length": Z_IMAGE_MAX_LENGTH}
    size = {"height": Z_IMAGE_RESOLUTION, "width": Z_IMAGE_RESOLUTION}
    return pipe(list(PROMPTS), latents=noise.clone(), output_type="latent", **size, **options).images


@pytest.mark.parametrize("route", ["lora", "transformer", "pipeline"])
def test_the_stock_z_image_pipeline_generates_what_flowpost_samples(z_image_export, z_image_pipeline_dir, route):
    from diffusers import ZImagePipeline, ZImageTransformer2DModel

    adapter, export = z_image_export
    pipe = _stock_pipeline(route, export, z_image_pipeline_dir, ZImagePipeline, ZImageTransformer2DModel)
    noise = _noise(adapter)
    expected = _flowpost_latents(adapter, noise)  # flowpost's guidance g is the pipeline's guidance_scale g - 1
    torch.testing.assert_close(_stock_z_image_latents(pipe, noise), expected, rtol=0, atol=1e-5)
    untrained = _stock_z_image_latents(ZImagePipeline.from_pretrained(z_image_pipeline_dir), noise)
    assert not torch.allclose(untrained, expected, atol=1e-3)  # the LoRA changed what is generated


FLUX2 = {  # variant: loader, folder fixture, max_sequence_length, pipeline class, flowpost's sampling guidance
    "dev": (load_flux2_adapter, "flux2_pipeline_dir", DEV_MAX_LENGTH, "Flux2Pipeline", 1.0),
    "klein": (load_flux2_klein_adapter, "flux2_klein_pipeline_dir", KLEIN_MAX_LENGTH, "Flux2KleinPipeline", 3.0),
}


@pytest.fixture(scope="module", params=sorted(FLUX2))
def flux2_export(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A FLUX.2 variant with trained-looking LoRA, exported as LoRA, transformer and pipeline folders."""
    load, fixture, max_length, pipeline_class, guidance = FLUX2[request.param]
    folder = request.getfixturevalue(fixture)
    adapter = _perturbed_lora(load(folder))
    export = _export(adapter, tmp_path_factory.mktemp(f"flux2-{request.param}-export"), ("diffusers", "pipeline"))
    return {
        "adapter": adapter,
        "export": export,
        "folder": folder,
        "max_length": max_length,
        "guidance": guidance,
        "pipeline_class": pipeline_class,
    }


def _stock_flux2_images(pipe: Any, noise: torch.Tensor, exported: dict[str, Any]) -> torch.Tensor:
    """The stock pipeline's images from flowpost's packed noise (its latents are ``[B, C, side, side]``); dev's
    ``guidance_scale`` is the embedded 4.0, klein's the CFG scale."""
    side = int(noise.shape[1] ** 0.5)
    grid = noise.transpose(1, 2).reshape(noise.shape[0], noise.shape[2], side, side)
    guidance = exported["adapter"].distilled_guidance if exported["guidance"] == 1.0 else exported["guidance"]
    options = {"num_inference_steps": STEPS, "guidance_scale": guidance, "max_sequence_length": exported["max_length"]}
    size = {"height": RESOLUTION, "width": RESOLUTION}
    return pipe(prompt=list(PROMPTS), latents=grid, output_type="pt", **size, **options).images


@pytest.mark.parametrize("route", ["lora", "transformer", "pipeline"])
def test_the_stock_flux2_pipelines_generate_what_flowpost_samples(flux2_export: dict[str, Any], route: str) -> None:
    import diffusers

    adapter, pipeline_class = flux2_export["adapter"], getattr(diffusers, flux2_export["pipeline_class"])
    pipe = _stock_pipeline(
        route, flux2_export["export"], flux2_export["folder"], pipeline_class, diffusers.Flux2Transformer2DModel
    )
    noise = _noise(adapter)
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0, 0]))
    with torch.no_grad():
        sigmas = adapter.inference_sigmas(STEPS)
        latents = sample_ode(adapter, noise, state, sigmas, guidance=flux2_export["guidance"], negative=negative)
        expected = adapter.decode(latents)
    torch.testing.assert_close(_stock_flux2_images(pipe, noise, flux2_export), expected, rtol=0, atol=1e-5)
    untrained = _stock_flux2_images(pipeline_class.from_pretrained(flux2_export["folder"]), noise, flux2_export)
    assert not torch.allclose(untrained, expected, atol=1e-3)  # the LoRA changed what is generated


def test_a_flux2_export_documents_its_folders(flux2_export: dict[str, Any]) -> None:
    export = flux2_export["export"]
    card = (export / "README.md").read_text()
    assert 'pipe.load_lora_weights("lora")' in card and "Flux2Transformer2DModel.from_pretrained" in card
    assert "sampling shifted by mu from FLUX.2's empirical fit" in card and "base_shift" not in card
    assert not (export / "lora_base").exists()  # the LoRA sits on the pretrained pipeline's transformer


@pytest.mark.parametrize(
    ("exported", "transformer_class"),
    [
        ("sd3_export", "SD3Transformer2DModel"),
        ("flux1_export", "FluxTransformer2DModel"),
        ("flux1_kontext_export", "FluxTransformer2DModel"),
        ("qwen_image_export", "QwenImageTransformer2DModel"),
        ("z_image_export", "ZImageTransformer2DModel"),
    ],
)
def test_a_pretrained_familys_export_documents_its_folders(request, exported: str, transformer_class: str) -> None:
    _, export = request.getfixturevalue(exported)
    card = (export / "README.md").read_text()
    assert 'pipe.load_lora_weights("lora")' in card and "DiffusionPipeline.from_pretrained" in card
    assert f"{transformer_class}.from_pretrained" in card
    assert not (export / "lora_base").exists()  # the LoRA sits on the pretrained pipeline's transformer


def test_the_tiny_familys_lora_loads_onto_its_base_transformer(tmp_path: Path) -> None:
    from diffusers import SD3Transformer2DModel

    adapter = _perturbed_lora(TinySD3Adapter.from_scratch(seed=0, overrides={"num_layers": 1}))
    export = _export(adapter, tmp_path)
    transformer = SD3Transformer2DModel.from_pretrained(export / "lora_base" / "transformer")
    transformer.load_lora_adapter(export / "lora", prefix="transformer", use_safetensors=True)
    latents, sigma = (
        torch.randn(2, *adapter.latent_shape, generator=torch.Generator().manual_seed(1)),
        torch.tensor(0.6),
    )
    state = adapter.prepare_condition_state(_random_conditions())
    with torch.no_grad():
        expected = adapter.velocity(latents, sigma, state)
        loaded = TinySD3Adapter(transformer).velocity(latents, sigma, state)
    torch.testing.assert_close(loaded, expected, rtol=0, atol=1e-5)
    assert "load_lora_adapter" in (export / "README.md").read_text()


def _random_conditions() -> Any:
    from flowpost.core.conditions import ConditionBatch

    generator = torch.Generator().manual_seed(2)
    return ConditionBatch(
        torch.randn(2, 16, 384, generator=generator), torch.ones(2, 16), torch.randn(2, 384, generator=generator)
    )
