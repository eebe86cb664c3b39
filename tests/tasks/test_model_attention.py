"""``model.attention``: the transformer's attention backend through diffusers' dispatch, checked at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pretrained_stage import sft_adapter, with_model
from tiny_flux1_pipeline import RESOLUTION, load_flux1_adapter

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.attention import known_attention_backends, set_attention
from flowpost.errors import FlowpostError
from flowpost.tasks.runner import PipelineRun

PROMPTS = ["a red cat", "a blue dog on a car"]


def _flux(folder: Path, attention: str) -> dict[str, Any]:
    options = {"resolution": RESOLUTION}
    return {"family": "flux1", "pretrained": str(folder), "attention": attention, "options": options}


def _state(adapter: Any) -> Any:
    """The prompts' condition state, encoded once per test by the folder's text encoders."""
    adapter.encoder_max_length = 8
    return adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))


def _velocity(adapter: Any, state: Any) -> torch.Tensor:
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
    sdpa = sft_adapter(with_model(tiny_pipeline, _flux(flux1_pipeline_dir, "sdpa")), tmp_path)
    assert {str(backend.value) for backend in _backends(sdpa)} == {"native"}
    state = _state(default)
    assert torch.equal(_velocity(sdpa, state), _velocity(default, state))


@pytest.fixture
def native_afterwards() -> Any:
    """Diffusers' process-wide active backend back to torch's SDPA after the test."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    yield
    _AttentionBackendRegistry.set_active_backend(AttentionBackendName.NATIVE)


def test_another_installed_backend_is_set_on_every_processor(
    tiny_pipeline, flux1_pipeline_dir: Path, tmp_path: Path, native_afterwards: None
) -> None:
    plain = load_flux1_adapter(flux1_pipeline_dir)
    state = _state(plain)
    math = sft_adapter(with_model(tiny_pipeline, _flux(flux1_pipeline_dir, "_native_math")), tmp_path)
    assert {str(backend.value) for backend in _backends(math)} == {"_native_math"}
    torch.testing.assert_close(_velocity(math, state), _velocity(plain, state), rtol=0, atol=1e-6)


def test_the_default_stays_out_of_the_stage_config(tiny_pipeline, flux1_pipeline_dir, tmp_path: Path) -> None:
    inputs = PipelineRun(
        validate_pipeline(with_model(tiny_pipeline, _flux(flux1_pipeline_dir, "sdpa"))), tmp_path
    ).inputs
    assert "attention" not in inputs["train.sft"]["config"]["model"]
    flash = validate_pipeline(with_model(tiny_pipeline, _flux(flux1_pipeline_dir, "flash")))
    assert PipelineRun(flash, tmp_path).inputs["train.sft"]["config"]["model"]["attention"] == "flash"


def test_an_unknown_backend_is_rejected_naming_its_path_and_the_known_ones(tiny_pipeline, flux1_pipeline_dir) -> None:
    assert {"sdpa", "flash", "sage", "xformers", "flex"} <= set(known_attention_backends())
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model\.attention.*unknown attention backend 'fast'.*sdpa"):
        validate_pipeline(with_model(tiny_pipeline, _flux(flux1_pipeline_dir, "fast")))


@pytest.mark.parametrize(("backend", "package"), [("flash", "flash-attn"), ("sage", "sageattention")])
def test_a_backend_whose_package_is_missing_says_what_to_install(
    tiny_pipeline, flux1_pipeline_dir: Path, tmp_path: Path, backend: str, package: str
) -> None:
    with pytest.raises(FlowpostError, match=rf"stages\.sft\.model\.attention: .*{backend!r} is not usable.*{package}"):
        sft_adapter(with_model(tiny_pipeline, _flux(flux1_pipeline_dir, backend)), tmp_path)


def test_sd3_keeps_its_processors_with_sdpa(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "attention": "sdpa"}
    processors = {
        type(p).__name__
        for p in sft_adapter(with_model(tiny_pipeline, model), tmp_path).module().attn_processors.values()
    }
    assert processors == {"JointAttnProcessor2_0"}


def test_tiny_sd3_joint_attention_dispatches_with_the_stock_output(
    tiny_pipeline, tmp_path: Path, native_afterwards: None
) -> None:
    from flowpost.core.models.text_state import TextState

    model = tiny_pipeline()["stages"]["sft"]["model"]
    plain = sft_adapter(tiny_pipeline(), tmp_path)
    dispatched = sft_adapter(with_model(tiny_pipeline, {**model, "attention": "_native_math"}), tmp_path)
    assert {type(p).__name__ for p in dispatched.module().attn_processors.values()} == {"DispatchedJointAttention"}
    generator = torch.Generator().manual_seed(0)
    state = TextState(torch.randn(2, 5, 384, generator=generator), torch.randn(2, 384, generator=generator))
    noise = torch.randn(2, *plain.latent_shape, generator=generator)
    sigma = torch.tensor([0.3, 0.8])
    with torch.no_grad():
        stock = plain.velocity(noise, sigma, state)
        torch.testing.assert_close(dispatched.velocity(noise, sigma, state), stock, rtol=0, atol=1e-6)
        set_attention(dispatched.module(), "sdpa")  # torch's SDPA through diffusers' dispatch
        assert torch.equal(dispatched.velocity(noise, sigma, state), stock)


@pytest.mark.slow
def test_sd3_joint_attention_dispatches_to_another_backend_with_the_stock_output(
    tiny_pipeline, sd3_pipeline_dir: Path, tmp_path: Path, native_afterwards: None
) -> None:
    from tiny_sd3_pipeline import load_sd3_adapter

    plain = load_sd3_adapter(sd3_pipeline_dir)
    state = _state(plain)
    default = _velocity(plain, state)
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "attention": "_native_math"}
    adapter = sft_adapter(with_model(tiny_pipeline, model), tmp_path)
    processors = adapter.module().attn_processors.values()
    assert {type(p).__name__ for p in processors} == {"DispatchedJointAttention"}
    assert {str(backend.value) for backend in _backends(adapter)} == {"_native_math"}
    torch.testing.assert_close(_velocity(adapter, state), default, rtol=0, atol=1e-6)
    set_attention(adapter.module(), "sdpa")  # diffusers' torch SDPA through the same processors
    assert torch.equal(_velocity(adapter, state), default)


def test_processors_that_neither_dispatch_nor_are_sd3s_joint_ones_are_refused(sd3_pipeline_dir: Path) -> None:
    from tiny_sd3_pipeline import load_sd3_adapter

    network = load_sd3_adapter(sd3_pipeline_dir).module()
    network.fuse_qkv_projections()  # diffusers' fused SD3 processors call torch's SDPA directly
    set_attention(network, "sdpa")
    with pytest.raises(FlowpostError, match=r"model\.attention: SD3Transformer2DModel's attention processors do not"):
        set_attention(network, "_native_math")
