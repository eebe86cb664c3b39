"""``model.attention``: the transformer's attention backend through diffusers' dispatch, checked at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_flux1_pipeline import RESOLUTION, load_flux1_adapter

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.attention import known_attention_backends
from flowpost.core.trainers.spec import StageSpec
from flowpost.errors import FlowpostError
from flowpost.stage import build_adapter
from flowpost.tasks.runner import PipelineRun

PROMPTS = ["a red cat", "a blue dog on a car"]


def _config(tiny_pipeline, model: dict[str, Any]) -> dict[str, Any]:
    config = tiny_pipeline()
    config["stages"]["sft"]["model"] = model
    if "pretrained" in model:
        encoders = {"family": model["family"], "pretrained": model["pretrained"]}
        config["conditions"]["own"] = {"model": encoders, "datasets": ["digits"]}
        config["stages"]["sft"]["data"]["conditions"] = "own"
    return config


def _build(config: dict[str, Any], tmp_path: Path) -> Any:
    stage = validate_pipeline(config).stages["sft"]
    return build_adapter(stage, StageSpec(stage="sft", seed=0, config={}, output_dir=str(tmp_path)))


def _flux(folder: Path, attention: str) -> dict[str, Any]:
    options = {"resolution": RESOLUTION}
    return {"family": "flux1", "pretrained": str(folder), "attention": attention, "options": options}


def _velocity(adapter: Any) -> torch.Tensor:
    adapter.encoder_max_length = 8
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    noise = torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return adapter.velocity(noise, torch.tensor([0.3, 0.8]), state)


def _backends(adapter: Any) -> set[Any]:
    return {
        module.processor._attention_backend
        for module in adapter.module().modules()
        if hasattr(getattr(module, "processor", None), "_attention_backend")
    }


def test_sdpa_gives_the_output_of_the_native_default(tiny_pipeline, flux1_pipeline_dir: Path, tmp_path: Path) -> None:
    default = load_flux1_adapter(flux1_pipeline_dir)
    assert _backends(default) == {None}
    sdpa = _build(_config(tiny_pipeline, _flux(flux1_pipeline_dir, "sdpa")), tmp_path)
    assert {str(backend.value) for backend in _backends(sdpa)} == {"native"}
    assert torch.equal(_velocity(sdpa), _velocity(default))


@pytest.fixture
def native_afterwards() -> Any:
    """Diffusers' process-wide active backend back to torch's SDPA after the test."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    yield
    _AttentionBackendRegistry.set_active_backend(AttentionBackendName.NATIVE)


def test_another_installed_backend_is_set_on_every_processor(
    tiny_pipeline, flux1_pipeline_dir: Path, tmp_path: Path, native_afterwards: None
) -> None:
    default = _velocity(load_flux1_adapter(flux1_pipeline_dir))
    math = _build(_config(tiny_pipeline, _flux(flux1_pipeline_dir, "_native_math")), tmp_path)
    assert {str(backend.value) for backend in _backends(math)} == {"_native_math"}
    torch.testing.assert_close(_velocity(math), default, rtol=0, atol=1e-6)


def test_the_default_stays_out_of_the_stage_config(tiny_pipeline, flux1_pipeline_dir, tmp_path: Path) -> None:
    inputs = PipelineRun(validate_pipeline(_config(tiny_pipeline, _flux(flux1_pipeline_dir, "sdpa"))), tmp_path).inputs
    assert "attention" not in inputs["train.sft"]["config"]["model"]
    flash = validate_pipeline(_config(tiny_pipeline, _flux(flux1_pipeline_dir, "flash")))
    assert PipelineRun(flash, tmp_path).inputs["train.sft"]["config"]["model"]["attention"] == "flash"


def test_an_unknown_backend_is_rejected_naming_its_path_and_the_known_ones(tiny_pipeline, flux1_pipeline_dir) -> None:
    assert {"sdpa", "flash", "sage", "xformers", "flex"} <= set(known_attention_backends())
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model\.attention.*unknown attention backend 'fast'.*sdpa"):
        validate_pipeline(_config(tiny_pipeline, _flux(flux1_pipeline_dir, "fast")))


@pytest.mark.parametrize(("backend", "package"), [("flash", "flash-attn"), ("sage", "sageattention")])
def test_a_backend_whose_package_is_missing_says_what_to_install(
    tiny_pipeline, flux1_pipeline_dir: Path, tmp_path: Path, backend: str, package: str
) -> None:
    with pytest.raises(FlowpostError, match=rf"stages\.sft\.model\.attention: .*{backend!r} is not usable.*{package}"):
        _build(_config(tiny_pipeline, _flux(flux1_pipeline_dir, backend)), tmp_path)


def test_sd3_processors_do_not_dispatch_so_only_sdpa_applies(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir)}
    assert _build(_config(tiny_pipeline, {**model, "attention": "sdpa"}), tmp_path).module() is not None
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model\.attention: SD3Transformer2DModel.*use sdpa"):
        _build(_config(tiny_pipeline, {**model, "attention": "_native_math"}), tmp_path)
