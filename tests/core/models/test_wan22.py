"""The wan22-a14b family (two experts) against the stock diffusers ``WanPipeline``, on a tiny random folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_sd3_pipeline import T5_LENGTH
from tiny_wan2_pipeline import BOUNDARY_RATIO, FRAMES, HEIGHT, WIDTH, load_wan2_adapter

from flowpost.core.models.footprint import model_footprint
from flowpost.core.models.registry import load_adapter
from flowpost.core.models.wan22 import Wan22Adapter
from flowpost.core.sampling.ode import sample_ode
from flowpost.errors import FlowpostError

PROMPTS = ["a red cat", "a blue dog on a car"]
FAMILY = "wan22-a14b"


def _load(folder: Path, **options: Any) -> Wan22Adapter:
    adapter = load_wan2_adapter(folder, family=FAMILY, options=options)
    assert isinstance(adapter, Wan22Adapter)
    return adapter


@pytest.fixture(scope="module")
def adapter(wan22_pipeline_dir: Path) -> Wan22Adapter:
    return _load(wan22_pipeline_dir)


@pytest.fixture(scope="module")
def stock(wan22_pipeline_dir: Path) -> Any:
    from diffusers import WanPipeline

    return WanPipeline.from_pretrained(wan22_pipeline_dir)


def _noise(adapter: Wan22Adapter, rows: int = len(PROMPTS)) -> torch.Tensor:
    return torch.randn(rows, *adapter.latent_shape, generator=torch.Generator().manual_seed(0))


def _state(adapter: Wan22Adapter) -> Any:
    return adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))


def test_both_experts_load_behind_the_boundary(adapter: Wan22Adapter, stock: Any) -> None:
    experts = adapter.module()
    assert experts.boundary_timestep == BOUNDARY_RATIO * 1000 and adapter.describe()["boundary_ratio"] == BOUNDARY_RATIO
    for ours, theirs in ((experts.high, stock.transformer), (experts.low, stock.transformer_2)):
        theirs_state = theirs.state_dict()
        assert all(torch.equal(value, theirs_state[key]) for key, value in ours.state_dict().items())
    assert not torch.equal(experts.high.proj_out.weight, experts.low.proj_out.weight)  # two sets of weights
    with pytest.raises(FlowpostError, match=r"launch\.backend: .*routes each rank's samples to its own expert"):
        adapter.shard_units()  # FSDP2's units
    assert torch.equal(adapter.routes_high(torch.tensor([1.0, 0.875, 0.8749, 0.1])), torch.tensor([1, 1, 0, 0]).bool())


def test_a_mixed_batch_sends_each_row_to_its_expert(adapter: Wan22Adapter) -> None:
    """One batch at sigmas 0.95 and 0.3 is row by row what each expert gives alone."""
    noise, state, sigma = _noise(adapter), _state(adapter), torch.tensor([0.95, 0.3])
    experts = adapter.module()
    with torch.no_grad():
        mixed = adapter.velocity(noise, sigma, state)
        alone = [
            expert(noise[i : i + 1], adapter.timestep(sigma[i : i + 1]), state.encoder_hidden_states[i : i + 1])[0]
            for i, expert in enumerate((experts.high, experts.low))
        ]
    torch.testing.assert_close(mixed, torch.cat(alone), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("guidance", "low_noise_guidance"), [(1.0, None), (5.0, None), (5.0, 2.0)])
def test_the_ode_sampler_reproduces_the_stock_pipeline(
    wan22_pipeline_dir: Path, stock: Any, guidance: float, low_noise_guidance: float | None
) -> None:
    """Four steps: the first at the high-noise expert, the others at the low-noise one, each with its guidance."""
    adapter = _load(wan22_pipeline_dir, low_noise_guidance=low_noise_guidance)
    sigmas = adapter.inference_sigmas(4)
    assert adapter.routes_high(sigmas[:-1]).tolist() == [True, False, False, False]
    noise = _noise(adapter)
    expected = stock(
        PROMPTS,
        latents=noise.clone(),
        num_inference_steps=4,
        guidance_scale=guidance,
        guidance_scale_2=low_noise_guidance,
        output_type="latent",
        height=HEIGHT,
        width=WIDTH,
        num_frames=FRAMES,
        max_sequence_length=T5_LENGTH,
    ).frames
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0, 0]))
    with torch.no_grad():
        latents = sample_ode(adapter, noise, _state(adapter), sigmas, guidance=guidance, negative=negative)
    torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)


def test_a_one_transformer_folder_and_an_unknown_expert_are_refused(wan2_pipeline_dir, wan22_pipeline_dir) -> None:
    with pytest.raises(FlowpostError, match=r"model_index\.json: a one-transformer Wan pipeline.*model\.family: wan2"):
        _load(wan2_pipeline_dir)
    with pytest.raises(FlowpostError, match=r"model\.options\.experts: experts is 'middle'; give one of both, high"):
        _load(wan22_pipeline_dir, experts="middle")
    with pytest.raises(FlowpostError, match=r"model_index\.json: a two-expert Wan2\.2 pipeline.*wan22-a14b"):
        load_wan2_adapter(wan22_pipeline_dir)


@pytest.mark.parametrize("experts", ["both", "high", "low"])
def test_lora_and_full_fine_tuning_train_the_chosen_experts(wan22_pipeline_dir: Path, experts: str) -> None:
    full = _load(wan22_pipeline_dir, experts=experts)
    trained = {name.split(".")[0] for name, p in full.module().named_parameters() if p.requires_grad}
    assert trained == set(full.trained_experts()) == ({"high", "low"} if experts == "both" else {experts})
    lora = _load(wan22_pipeline_dir, experts=experts)
    lora.add_lora(rank=2, alpha=2.0)
    names = [name for name, p in lora.module().named_parameters() if p.requires_grad]
    assert names and all("lora_" in name for name in names)
    assert {name.split(".")[0] for name in names} == trained and lora.lora["experts"] == full.trained_experts()
    footprint = model_footprint(lora)  # both experts' weights, one expert's blocks per sample
    assert footprint.parameters == sum(p.numel() for p in lora.module().parameters()) and footprint.blocks == 2
    routed = lora.routes_high(lora.training_sigmas(torch.linspace(0.0, 0.99, 12)))  # SFT's draws, mapped
    assert routed.tolist() == {"both": [False] * 10 + [True] * 2, "high": [True] * 12, "low": [False] * 12}[experts]


def test_save_and_load_keep_both_merged_experts_and_options(adapter, wan22_pipeline_dir: Path, tmp_path: Path) -> None:
    tuned = _load(wan22_pipeline_dir, experts="low", low_noise_guidance=3.0)
    tuned.add_lora(rank=2, alpha=2.0)
    with torch.no_grad():
        for name, param in tuned.module().named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    tuned.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"transformer", "transformer_2", "lora_2", "scheduler"}
    assert not (tmp_path / "lora").exists()
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, Wan22Adapter) and (loaded.experts, loaded.low_noise_guidance) == ("low", 3.0)
    noise, sigma = _noise(adapter), torch.tensor([0.95, 0.3])
    with torch.no_grad():
        before, after, now = (a.velocity(noise, sigma, _state(a)) for a in (adapter, tuned, loaded))
    torch.testing.assert_close(now, after, rtol=0, atol=1e-5)
    torch.testing.assert_close(now[0], before[0], rtol=0, atol=0)  # the high-noise expert untouched
    assert not torch.allclose(now[1], before[1])


def test_validation_names_fsdp2_a_bad_experts_option_and_the_family_for_two_experts(
    tiny_pipeline, wan22_pipeline_dir: Path
) -> None:
    from pretrained_stage import with_model

    from flowpost.core.config.loading import validate_pipeline

    options = {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES, "experts": "middle"}
    config = with_model(tiny_pipeline, {"family": FAMILY, "pretrained": str(wan22_pipeline_dir), "options": options})
    config["stages"]["sft"]["launch"] = {"num_processes": 2, "backend": "fsdp2"}
    with pytest.raises(FlowpostError) as refused:
        validate_pipeline(config)
    assert "stages.sft.model.options.experts: experts is 'middle'" in str(refused.value)
    assert "stages.sft.launch.backend: family 'wan22-a14b' runs different blocks on different ranks" in str(
        refused.value
    )
    size = {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES}
    config = with_model(tiny_pipeline, {"family": "wan2", "pretrained": str(wan22_pipeline_dir), "options": size})
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model\.pretrained: .*two-expert.*family: wan22-a14b"):
        validate_pipeline(config)


def test_lora_trainer_roles_are_refused_and_full_copies_hold_both_experts(wan22_pipeline_dir: Path) -> None:
    lora = _load(wan22_pipeline_dir)
    lora.add_lora(rank=2, alpha=2.0)
    with pytest.raises(FlowpostError, match=r"model\.lora: trainer roles \(generator, fake_score\) share one LoRA"):
        lora.add_component_variants(["generator", "fake_score"])
    full = _load(wan22_pipeline_dir)
    full.add_component_variants(["generator", "fake_score"])
    with full.use_component_variant("fake_score") as variant:
        assert variant.module() is not full.variants.module("generator")
        assert variant.module().boundary_timestep == BOUNDARY_RATIO * 1000
