"""``model.compile``: torch.compile of the transformer's repeated blocks (regional) or of the whole network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pretrained_stage import sft_adapter, with_model
from tiny_flux1_pipeline import RESOLUTION, load_flux1_adapter

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.compile import is_compiled
from flowpost.errors import FlowpostError
from flowpost.tasks.runner import PipelineRun

PROMPTS = ["a red cat", "a blue dog on a car"]


def _flux(folder: Path, **model: Any) -> dict[str, Any]:
    return {"family": "flux1", "pretrained": str(folder), "options": {"resolution": RESOLUTION}, **model}


def _tiny(tiny_pipeline, **model: Any) -> dict[str, Any]:
    return {**tiny_pipeline()["stages"]["sft"]["model"], **model}


def _compiled(network: torch.nn.Module) -> list[str]:
    return sorted({type(module).__name__ for module in network.modules() if is_compiled(module)})


def _velocity(adapter: Any, *, grad: bool = False) -> torch.Tensor:
    adapter.encoder_max_length = 8
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    noise = torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(0))
    with torch.set_grad_enabled(grad):
        return adapter.velocity(noise, torch.tensor([0.3, 0.8]), state)


def test_regional_compile_wraps_each_repeated_block_in_place(
    tiny_pipeline, flux1_pipeline_dir: Path, tmp_path: Path
) -> None:
    plain = load_flux1_adapter(flux1_pipeline_dir)
    network = sft_adapter(
        with_model(tiny_pipeline, _flux(flux1_pipeline_dir, compile={"backend": "eager"})), tmp_path
    ).module()
    assert _compiled(network) == ["FluxSingleTransformerBlock", "FluxTransformerBlock"]
    assert not is_compiled(network)
    assert list(network.state_dict()) == list(plain.module().state_dict())  # compiled in place: same names


@pytest.mark.slow
def test_regionally_compiled_blocks_give_the_eager_output(tiny_pipeline, flux1_pipeline_dir, tmp_path) -> None:
    plain = load_flux1_adapter(flux1_pipeline_dir)
    adapter = sft_adapter(with_model(tiny_pipeline, _flux(flux1_pipeline_dir, compile={"backend": "eager"})), tmp_path)
    assert torch.equal(_velocity(adapter), _velocity(plain))


def test_regional_false_compiles_the_whole_network(tiny_pipeline, flux1_pipeline_dir: Path, tmp_path: Path) -> None:
    model = _flux(flux1_pipeline_dir, compile={"backend": "eager", "regional": False})
    assert _compiled(sft_adapter(with_model(tiny_pipeline, model), tmp_path).module()) == ["FluxTransformer2DModel"]


def test_sd3_without_declared_repeated_blocks_compiles_its_joint_blocks(tiny_pipeline, tmp_path: Path) -> None:
    model = _tiny(tiny_pipeline, compile={"backend": "eager"})
    assert _compiled(sft_adapter(with_model(tiny_pipeline, model), tmp_path).module()) == ["JointTransformerBlock"]


def test_role_copies_declared_later_are_compiled_too(tiny_pipeline, tmp_path: Path) -> None:
    model = _tiny(tiny_pipeline, compile={"backend": "eager"})
    adapter = sft_adapter(with_model(tiny_pipeline, model), tmp_path)
    adapter.add_component_variants(["generator", "fake_score"])
    generator, fake = adapter.role_networks()
    assert generator is not fake
    assert _compiled(generator) == _compiled(fake) == ["JointTransformerBlock"]


def test_compile_stays_out_of_the_stage_config_unless_set(tiny_pipeline, tmp_path: Path) -> None:
    plain = PipelineRun(validate_pipeline(tiny_pipeline()), tmp_path).inputs["train.sft"]
    assert "compile" not in plain["config"]["model"]
    model = _tiny(tiny_pipeline, compile={"mode": "max-autotune"})
    inputs = PipelineRun(validate_pipeline(with_model(tiny_pipeline, model)), tmp_path).inputs["train.sft"]
    assert inputs["config"]["model"]["compile"]["mode"] == "max-autotune"
    assert inputs["config"]["model"]["compile"]["regional"] is True


def test_a_bad_compile_mode_names_its_path(tiny_pipeline) -> None:
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model\.compile\.mode"):
        validate_pipeline(with_model(tiny_pipeline, _tiny(tiny_pipeline, compile={"mode": "fastest"})))


@pytest.mark.slow
def test_compiled_lora_blocks_give_the_eager_gradients(tiny_pipeline, flux1_pipeline_dir: Path, tmp_path) -> None:
    """Through dynamo and AOT autograd (``aot_eager``; inductor's C++ build takes minutes on a CPU)."""
    lora = {"rank": 2}
    eager = sft_adapter(with_model(tiny_pipeline, _flux(flux1_pipeline_dir, lora=lora)), tmp_path)
    model = _flux(flux1_pipeline_dir, lora=lora, compile={"backend": "aot_eager"})
    compiled = sft_adapter(with_model(tiny_pipeline, model), tmp_path)
    grads = []
    for adapter in (eager, compiled):
        for name, param in adapter.module().named_parameters():
            if "lora_A" in name:  # B starts at zero: give A a gradient
                torch.nn.init.normal_(param, generator=torch.Generator().manual_seed(1))
            if "lora_B" in name:
                torch.nn.init.constant_(param, 0.01)
        _velocity(adapter, grad=True).square().mean().backward()
        grads.append({n: p.grad for n, p in adapter.module().named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-6)
