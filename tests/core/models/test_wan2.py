"""The wan2 family against the stock diffusers ``WanPipeline``, on a tiny random text-to-video folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_sd3_pipeline import T5_LENGTH
from tiny_wan2_pipeline import FLOW_SHIFT, FRAMES, HEIGHT, UMT5_WIDTH, WIDTH, load_wan2_adapter

from flowpost.core.models.registry import load_adapter
from flowpost.core.models.wan2 import Wan2Adapter
from flowpost.core.sampling.ode import sample_ode
from flowpost.errors import FlowpostError

PROMPTS = ["a red cat", "a blue dog on a car"]


def _load(folder: Path, **options: Any) -> Wan2Adapter:
    adapter = load_wan2_adapter(folder, **options)
    assert isinstance(adapter, Wan2Adapter)
    return adapter


@pytest.fixture(scope="module")
def adapter(wan2_pipeline_dir: Path) -> Wan2Adapter:
    return _load(wan2_pipeline_dir)


@pytest.fixture(scope="module")
def stock(wan2_pipeline_dir: Path) -> Any:
    from diffusers import WanPipeline

    return WanPipeline.from_pretrained(wan2_pipeline_dir)


def _noise(adapter: Wan2Adapter, seed: int = 0) -> torch.Tensor:
    return torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(seed))


def _velocity(adapter: Wan2Adapter) -> torch.Tensor:
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    with torch.no_grad():
        return adapter.velocity(_noise(adapter), torch.tensor([0.3, 0.8]), state)


def test_the_registry_loads_a_video_pipeline_folder(adapter: Wan2Adapter, wan2_pipeline_dir: Path) -> None:
    assert adapter.latent_shape == (4, 2, HEIGHT // 4, WIDTH // 4)  # (5 - 1) / 4 + 1 latent frames
    assert adapter.shift == FLOW_SHIFT and adapter.describe()["pretrained"]["path"] == str(wan2_pipeline_dir)
    assert len(adapter.shard_units()) == 2  # the transformer's blocks


def test_conditions_are_the_stock_token_states_and_their_mask(adapter: Wan2Adapter, stock: Any) -> None:
    batch = adapter.encode_conditions(PROMPTS)
    embeds, _ = stock.encode_prompt(PROMPTS, do_classifier_free_guidance=False, max_sequence_length=T5_LENGTH)
    assert batch.token_states.shape == (2, T5_LENGTH, UMT5_WIDTH) and batch.pooled.shape == (2, 0)
    torch.testing.assert_close(batch.token_states, embeds, rtol=1e-5, atol=1e-5)  # two encoder calls, fp32
    lengths = batch.token_mask.sum(1)
    assert int(lengths[0]) < T5_LENGTH  # the short prompt is padded ...
    for row, length in enumerate(lengths.tolist()):  # ... with zero states where the mask is 0
        assert bool((batch.token_mask[row, :length] == 1).all()) and not batch.token_states[row, length:].any()


@pytest.mark.parametrize("steps", [1, 4, 50])
def test_inference_sigmas_are_the_flow_shift_schedulers(adapter: Wan2Adapter, steps: int) -> None:
    scheduler = type(adapter.scheduler).from_config(adapter.scheduler.config)
    scheduler.set_timesteps(steps)
    sigmas = adapter.inference_sigmas(steps)
    assert torch.equal(sigmas, scheduler.sigmas) and float(sigmas[-1]) == 0.0
    assert torch.equal(adapter.timestep(sigmas[:-1]), scheduler.timesteps)


def test_a_unipc_scheduler_gives_its_flow_sigmas(wan2_pipeline_dir: Path, tmp_path: Path) -> None:
    """Wan2.1's hub folders ship UniPC with ``flow_shift``: flowpost integrates over its sigmas."""
    from diffusers import UniPCMultistepScheduler

    folder = tmp_path / "unipc"
    shutil.copytree(wan2_pipeline_dir, folder)
    shutil.rmtree(folder / "scheduler")
    unipc = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0)
    unipc.save_pretrained(folder / "scheduler")
    adapter = _load(folder)
    unipc.set_timesteps(8)
    sigmas = adapter.inference_sigmas(8)
    assert adapter.shift == 5.0 and torch.equal(sigmas, unipc.sigmas.float())
    assert torch.equal(adapter.timestep(sigmas[:-1]), unipc.timesteps.float())  # whole numbers, as UniPC's


def test_an_unknown_scheduler_or_video_size_is_refused(wan2_pipeline_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ddim"
    shutil.copytree(wan2_pipeline_dir, folder)
    config = folder / "scheduler" / "scheduler_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "_class_name": "DDIMScheduler"}))
    with pytest.raises(FlowpostError, match=r"scheduler.*'DDIMScheduler'"):
        _load(folder)
    with pytest.raises(FlowpostError, match=r"model\.options\.num_frames.*4 k \+ 1"):
        Wan2Adapter.from_pipeline(load_wan2_adapter(wan2_pipeline_dir).source, num_frames=6)
    with pytest.raises(FlowpostError, match=r"model\.options\.width: width 20 is not a multiple of 16"):
        Wan2Adapter.from_pipeline(load_wan2_adapter(wan2_pipeline_dir).source, height=HEIGHT, width=20)


@pytest.mark.parametrize(("steps", "guidance"), [(3, 1.0), (4, 5.0)])
def test_the_ode_sampler_reproduces_the_stock_pipeline(adapter: Wan2Adapter, stock: Any, steps, guidance) -> None:
    noise = _noise(adapter)
    options = {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES, "max_sequence_length": T5_LENGTH}
    expected = stock(
        PROMPTS,
        latents=noise.clone(),
        num_inference_steps=steps,
        guidance_scale=guidance,
        output_type="latent",
        **options,
    ).frames
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0, 0]))
    latents = sample_ode(adapter, noise, state, adapter.inference_sigmas(steps), guidance=guidance, negative=negative)
    torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)
    videos = stock(
        PROMPTS, latents=noise.clone(), num_inference_steps=steps, guidance_scale=guidance, output_type="pt", **options
    ).frames  # [B, T, C, H, W]
    decoded = adapter.decode(latents)
    assert decoded.shape == (2, 3, FRAMES, HEIGHT, WIDTH)
    torch.testing.assert_close(decoded, videos.permute(0, 2, 1, 3, 4), rtol=0, atol=1e-5)


def _with_index(folder: Path, tmp_path: Path, **index: Any) -> Path:
    """A copy of ``folder`` whose ``model_index.json`` has ``index`` set."""
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    path = copy / "model_index.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **index}))
    return copy


def test_wan22_ti2v_per_token_timesteps_give_the_same_video(wan2_pipeline_dir: Path, tmp_path: Path) -> None:
    from diffusers import WanPipeline

    folder = _with_index(wan2_pipeline_dir, tmp_path, expand_timesteps=True)  # Wan2.2 TI2V-5B's pipeline
    adapter, stock = _load(folder), WanPipeline.from_pretrained(folder)
    noise = _noise(adapter)
    size = {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES, "max_sequence_length": T5_LENGTH}
    expected = stock(PROMPTS, latents=noise.clone(), num_inference_steps=3, output_type="latent", **size).frames
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    negative = adapter.prepare_condition_state(adapter.encode_conditions([""]).index([0, 0]))
    latents = sample_ode(adapter, noise, state, adapter.inference_sigmas(3), guidance=5.0, negative=negative)
    torch.testing.assert_close(latents, expected, rtol=0, atol=1e-5)


def test_a_two_expert_wan22_pipeline_is_refused(wan2_pipeline_dir: Path, tmp_path: Path) -> None:
    folder = _with_index(wan2_pipeline_dir, tmp_path, boundary_ratio=0.875)
    with pytest.raises(FlowpostError, match=r"model_index\.json: a two-expert Wan2\.2 pipeline.*0\.875"):
        _load(folder)


def test_vae_round_trip_and_tiled_decoding(wan2_pipeline_dir: Path) -> None:
    media = torch.rand(2, 3, FRAMES, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(0))
    adapter = _load(wan2_pipeline_dir)
    with torch.no_grad():
        latents = adapter.encode_output_state(media)
        videos = adapter.decode(latents)
    assert latents.shape == (2, *adapter.latent_shape) and latents.dtype == media.dtype
    assert videos.shape == media.shape and 0.0 <= float(videos.min()) <= float(videos.max()) <= 1.0
    tiled = Wan2Adapter.from_pipeline(adapter.source, height=HEIGHT, width=WIDTH, num_frames=FRAMES, vae_tiling=True)
    tiled.vae.enable_tiling(16, 16, 8, 8)  # tiles smaller than the video: the tiled path runs
    with torch.no_grad():
        blended = tiled.decode(latents[:1])
    assert tiled.vae.use_tiling and tiled.vae.use_slicing and blended.shape == videos[:1].shape
    assert float((blended - videos[:1]).abs().mean()) < 0.05  # the same video, up to blending at tile seams


def test_save_and_load_keep_the_merged_weights_and_video_options(adapter, wan2_pipeline_dir, tmp_path) -> None:
    tuned = _load(wan2_pipeline_dir)
    tuned.fps = 8
    tuned.add_lora(rank=2, alpha=2.0)
    trainable = [name for name, p in tuned.module().named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert any("attn2.to_k.lora_A" in name for name in trainable)  # cross-attention too
    with torch.no_grad():
        for name, param in tuned.module().named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    tuned.save_pretrained(tmp_path)
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, Wan2Adapter) and loaded.source == tuned.source
    assert (loaded.height, loaded.width, loaded.num_frames, loaded.fps) == (HEIGHT, WIDTH, FRAMES, 8)
    torch.testing.assert_close(_velocity(loaded), _velocity(tuned), rtol=0, atol=1e-5)
    assert not torch.allclose(_velocity(loaded), _velocity(adapter))


def test_component_folders_replace_the_transformer_and_the_video_vae(adapter, wan2_pipeline_dir, tmp_path) -> None:
    tuned = _load(wan2_pipeline_dir)
    with torch.no_grad():
        for param in tuned.module().parameters():
            param.add_(0.01)
    tuned.module().save_pretrained(tmp_path / "transformer")
    vae = _load(wan2_pipeline_dir).vae
    with torch.no_grad():
        for param in vae.parameters():
            param.mul_(1.1)
    vae.save_pretrained(tmp_path / "vae")
    replaced = _load(
        wan2_pipeline_dir, components={"transformer": str(tmp_path / "transformer"), "vae": str(tmp_path / "vae")}
    )
    torch.testing.assert_close(_velocity(replaced), _velocity(tuned), rtol=0, atol=0)
    assert not torch.allclose(_velocity(replaced), _velocity(adapter))
    assert replaced.vae.use_slicing and all(
        torch.equal(a, b) for a, b in zip(replaced.vae.parameters(), vae.parameters(), strict=True)
    )
    with pytest.raises(FlowpostError, match=r"'vae' component holds a WanTransformer3DModel, but"):
        _load(wan2_pipeline_dir, components={"vae": str(tmp_path / "transformer")}).decode(_noise(adapter))
