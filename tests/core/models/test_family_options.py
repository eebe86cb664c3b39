"""``model.options`` every pipeline family shares or that sd3 gained: ``resolution`` for sd3 (bounded by the
transformer's positional embedding) and ``gradient_checkpointing`` for every family, recorded in the manifest
and restored by ``from_pretrained``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pretrained_stage import sft_adapter, with_model
from tiny_flux1_pipeline import RESOLUTION as FLUX1_RESOLUTION
from tiny_flux2_pipeline import RESOLUTION as FLUX2_RESOLUTION
from tiny_qwen_image_pipeline import RESOLUTION as QWEN_IMAGE_RESOLUTION
from tiny_sd3_pipeline import T5_LENGTH
from tiny_wan2_pipeline import FRAMES, HEIGHT, WIDTH
from tiny_z_image_pipeline import RESOLUTION as Z_IMAGE_RESOLUTION

from flowpost.core.models.registry import adapter_class
from flowpost.core.models.sd3 import SD3Adapter
from flowpost.errors import FlowpostError

PROMPTS = ["a red cat", "a blue dog on a car"]
# the tiny SD3 transformer: sample_size 8, patch 2, pos_embed_max_size 8; its VAE downsamples 2x, so the stock
# side is 16 px, a side is a multiple of 2 x 2 = 4 px and at most 8 patches = 32 px
FAMILIES = {
    "sd3": ("sd3_pipeline_dir", {}),
    "flux1": ("flux1_pipeline_dir", {"resolution": FLUX1_RESOLUTION}),
    "qwen-image": ("qwen_image_pipeline_dir", {"resolution": QWEN_IMAGE_RESOLUTION}),
    "wan2": ("wan2_pipeline_dir", {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES}),
    "wan22-a14b": ("wan22_pipeline_dir", {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES}),
    "z-image": ("z_image_pipeline_dir", {"resolution": Z_IMAGE_RESOLUTION}),
    "flux2": ("flux2_pipeline_dir", {"resolution": FLUX2_RESOLUTION}),
    "flux2-klein": ("flux2_klein_pipeline_dir", {"resolution": FLUX2_RESOLUTION}),
}


def _sd3(tiny_pipeline, folder: Path, tmp_path: Path, options: dict[str, Any]) -> Any:
    model = {"family": "sd3", "pretrained": str(folder), "options": options}
    return sft_adapter(with_model(tiny_pipeline, model), tmp_path)


@pytest.mark.parametrize(
    ("resolution", "side"),
    [(8, 4), (24, 12)],  # half the stock side (as 512 px is for SD3.5-Medium's 1024), and beyond sample_size
)
def test_sd3_trains_at_its_resolution(tiny_pipeline, sd3_pipeline_dir, tmp_path, resolution, side) -> None:
    adapter = _sd3(tiny_pipeline, sd3_pipeline_dir, tmp_path, {"resolution": resolution})
    assert isinstance(adapter, SD3Adapter) and adapter.resolution == resolution
    assert adapter.latent_shape == (16, side, side)
    adapter.encoder_max_length = T5_LENGTH
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    latents = torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        velocity = adapter.velocity(latents, torch.tensor(0.5), state)
    assert velocity.shape == latents.shape and bool(torch.isfinite(velocity).all())
    media = adapter.decode(latents)
    assert media.shape == (len(PROMPTS), 3, resolution, resolution)


def test_sd3_defaults_to_the_stock_side(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    adapter = _sd3(tiny_pipeline, sd3_pipeline_dir, tmp_path, {})
    assert adapter.resolution == 16 and adapter.latent_shape == (16, 8, 8)


@pytest.mark.parametrize(
    ("resolution", "message"),
    [
        (36, r"9 patches a side, beyond the 8 .*pos_embed_max_size.*at most 32"),
        (10, r"not a positive multiple of 4 pixels"),
        (0, r"not a positive multiple of 4 pixels"),
        ("512", r"not a positive multiple of 4 pixels"),
    ],
)
def test_a_bad_sd3_resolution_names_its_option_path(tiny_pipeline, sd3_pipeline_dir, tmp_path, resolution, message):
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model\.options\.resolution: resolution .*" + message):
        _sd3(tiny_pipeline, sd3_pipeline_dir, tmp_path, {"resolution": resolution})


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_lists_gradient_checkpointing(family: str) -> None:
    assert "gradient_checkpointing" in adapter_class(family).options


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gradient_checkpointing_reaches_the_transformer_and_survives_a_save(
    tiny_pipeline, request: pytest.FixtureRequest, tmp_path: Path, family: str
) -> None:
    fixture, options = FAMILIES[family]
    folder = request.getfixturevalue(fixture)
    model = {"family": family, "pretrained": str(folder), "options": {**options, "gradient_checkpointing": True}}
    adapter = sft_adapter(with_model(tiny_pipeline, model), tmp_path / "stage")
    assert adapter.transformer.is_gradient_checkpointing is True  # wan22-a14b: each expert's
    assert adapter.describe()["gradient_checkpointing"] is True
    adapter.save_pretrained(tmp_path / "saved")
    loaded = adapter_class(family).from_pretrained(tmp_path / "saved")
    assert loaded.gradient_checkpointing is True and loaded.transformer.is_gradient_checkpointing is True
    assert loaded.latent_shape == adapter.latent_shape


def test_gradient_checkpointing_is_off_by_default_and_not_part_of_the_codec(
    tiny_pipeline, sd3_pipeline_dir, tmp_path
) -> None:
    plain = _sd3(tiny_pipeline, sd3_pipeline_dir, tmp_path / "plain", {})
    checkpointed = _sd3(tiny_pipeline, sd3_pipeline_dir, tmp_path / "on", {"gradient_checkpointing": True})
    assert plain.transformer.gradient_checkpointing is False
    assert plain.codec_fingerprint() == checkpointed.codec_fingerprint()  # a latent cache serves both


def test_sd3_resolution_survives_a_save(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    adapter = _sd3(tiny_pipeline, sd3_pipeline_dir, tmp_path, {"resolution": 8})
    adapter.save_pretrained(tmp_path / "saved")
    loaded = SD3Adapter.from_pretrained(tmp_path / "saved")
    assert loaded.resolution == 8 and loaded.latent_shape == (16, 4, 4)
