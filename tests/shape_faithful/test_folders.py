"""Each shape-faithful folder loads in bf16 into diffusers' stock pipeline, which generates a finite tiny
output, and into flowpost's family adapter at the published transformer size, whose velocity is finite."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from flowpost.core.models.footprint import attention_width
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.registry import adapter_class
from flowpost.stage import pipeline_adapter
from shape_faithful.build import CHECKPOINTS, is_edit, published, seeded_edit_conditions, stock_pipeline

pytestmark = pytest.mark.shape

PROMPT = "a red cat"
SIDE, FRAMES, STEPS = 64, 5, 2  # the stock pipelines' tiny output: 64 x 64 pixels, 5 video frames, 2 steps
FAMILY_OPTIONS: dict[str, dict[str, Any]] = {  # model.options giving a small latent shape (sd3's is fixed)
    "sd3": {},
    "flux1": {"resolution": 128},
    "flux1-kontext": {"resolution": 128},
    "qwen-image": {"resolution": 128},
    "wan2": {"height": SIDE, "width": SIDE, "num_frames": FRAMES},
    "wan22-a14b": {"height": SIDE, "width": SIDE, "num_frames": FRAMES},
    "z-image": {"resolution": 128},
    "flux2": {"resolution": 128},
    "flux2-klein": {"resolution": 128},
    "qwen-image-edit": {"resolution": 128},
    "qwen-image-edit-plus": {"resolution": 128},
}
VIDEO = ("wan2", "wan22-a14b")
# the stock edit pipelines' source options: Qwen-Image-Edit's read it at 1024 x 1024 pixels whatever its size;
# Kontext's keep it at its own 64 px (not the 1024 px the family trains with)
EDIT_OPTIONS: dict[str, dict[str, Any]] = {"flux1-kontext": {"_auto_resize": False, "max_area": SIDE * SIDE}}


@pytest.fixture(autouse=True)
def _release() -> Iterator[None]:
    """Free each test's models before the next builds or loads its own."""
    yield
    gc.collect()


def _generate(checkpoint: str, folder: Path) -> torch.Tensor:
    pipeline = stock_pipeline(checkpoint, folder)
    assert pipeline.transformer.dtype == torch.bfloat16
    options: dict[str, Any] = {"height": SIDE, "width": SIDE, "num_inference_steps": STEPS, "output_type": "pt"}
    if CHECKPOINTS[checkpoint].family in VIDEO:
        options["num_frames"] = FRAMES
    if is_edit(checkpoint):
        family = CHECKPOINTS[checkpoint].family
        options.update(image=Image.new("RGB", (SIDE, SIDE), (200, 40, 40)), **EDIT_OPTIONS.get(family, {}))
    with torch.no_grad():
        output = pipeline(prompt=PROMPT, generator=torch.Generator().manual_seed(0), **options)
    return output.frames if CHECKPOINTS[checkpoint].family in VIDEO else output.images


@pytest.mark.parametrize("checkpoint", list(CHECKPOINTS))
def test_the_stock_pipeline_generates_a_finite_output(checkpoint: str, shape_folder: Callable[[str], Path]) -> None:
    media = _generate(checkpoint, shape_folder(checkpoint))
    expected = (1, FRAMES, 3, SIDE, SIDE) if CHECKPOINTS[checkpoint].family in VIDEO else (1, 3, SIDE, SIDE)
    assert tuple(media.shape) == expected
    assert bool(torch.isfinite(media).all())


@pytest.mark.parametrize("checkpoint", list(CHECKPOINTS))
def test_the_family_adapter_loads_it_at_the_published_size(
    checkpoint: str, shape_folder: Callable[[str], Path]
) -> None:
    spec = CHECKPOINTS[checkpoint]
    source = PretrainedSource(str(shape_folder(checkpoint)), torch_dtype="bfloat16")
    adapter = pipeline_adapter(adapter_class(spec.family), source, FAMILY_OPTIONS[spec.family], where="stages.shape")
    config, expected = adapter.transformer.config, published(checkpoint, "transformer")
    heads = "num_attention_heads" if "num_attention_heads" in expected else "n_heads"  # Z-Image: n_heads, dim
    assert config[heads] == expected[heads] and attention_width(config) == attention_width(expected) == spec.width
    to_q = [module for name, module in adapter.transformer.named_modules() if name.endswith(".to_q")]
    if spec.family == "wan22-a14b":
        assert len(to_q) == 4  # self- and cross-attention of each expert's block
    assert all(tuple(q.weight.shape) == (spec.width, spec.width) and q.weight.dtype == torch.bfloat16 for q in to_q)

    adapter.compute_dtype = torch.bfloat16
    if is_edit(checkpoint):  # seeded at the published widths (``seeded_edit_conditions``)
        batch = seeded_edit_conditions(checkpoint, [PROMPT])
    else:
        batch = adapter.encode_conditions([PROMPT])
    state = adapter.prepare_condition_state(batch)
    latents = torch.randn(1, *adapter.latent_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        velocity = adapter.velocity(latents, torch.tensor([0.7]), state)
    assert velocity.shape == latents.shape and velocity.dtype == latents.dtype
    assert bool(torch.isfinite(velocity).all())
