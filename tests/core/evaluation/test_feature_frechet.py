"""``fd_clip`` and ``fd_dinov2`` on tiny random models saved locally, against the models run through
their own image processors and the Fréchet formula written out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
from PIL import Image
from transformers import (
    AutoImageProcessor,
    BitImageProcessor,
    CLIPConfig,
    CLIPImageProcessor,
    CLIPModel,
    Dinov2Config,
    Dinov2Model,
)

from flowpost.core.evaluation.registry import build_metric
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.errors import FlowpostError

SIZE = 32
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-clip-features")
    tower = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = CLIPConfig(
        text_config={**tower, "vocab_size": 40, "max_position_embeddings": 16},
        vision_config={**tower, "image_size": SIZE, "patch_size": 8},
        projection_dim=4,
    )
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def dinov2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-dinov2")
    config = Dinov2Config(
        hidden_size=8, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2, image_size=SIZE, patch_size=8
    )
    torch.manual_seed(1)
    Dinov2Model(config).save_pretrained(folder)
    processor = BitImageProcessor(
        size={"shortest_edge": SIZE},
        crop_size={"height": SIZE, "width": SIZE},
        image_mean=MEAN,
        image_std=STD,
    )
    processor.save_pretrained(folder)
    return folder


def _images(n: int, seed: int, high: int = 256) -> torch.Tensor:
    """Pixel values below ``high`` / 255, exact multiples of 1/255 (PIL sees what torch sees)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (n, 3, SIZE, SIZE), generator=generator).float() / 255


def _processed_features(folder: Path, images: torch.Tensor, *, clip: bool) -> np.ndarray:
    """The features of ``images`` through the stock image processor (PIL images in) and the model."""
    processor = AutoImageProcessor.from_pretrained(folder)
    pil = [Image.fromarray((image * 255).round().byte().permute(1, 2, 0).numpy()) for image in images]
    pixels = processor(images=pil, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        if clip:
            output = CLIPModel.from_pretrained(folder).eval().get_image_features(pixel_values=pixels)
            features = output if isinstance(output, torch.Tensor) else output.pooler_output
        else:
            features = Dinov2Model.from_pretrained(folder).eval()(pixel_values=pixels).pooler_output
    return features.double().numpy()


def _frechet(a: np.ndarray, b: np.ndarray) -> float:
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root = np.real(scipy.linalg.sqrtm(cov_a @ cov_b))
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * root))


@pytest.mark.parametrize(("name", "clip"), [("fd_clip", True), ("fd_dinov2", False)])
def test_feature_fd_matches_the_stock_processor_and_the_formula(
    name: str, clip: bool, clip_dir: Path, dinov2_dir: Path
) -> None:
    folder = clip_dir if clip else dinov2_dir
    generated, real = _images(16, seed=0), _images(16, seed=1, high=64)  # darker real images
    metric = build_metric(
        name, options={"model": str(folder), "batch_size": 5}, where="evaluate.metrics.0", assets_dir=None
    )
    samples = EvalSamples(images=generated, prompts=["p"] * 16, metadata=[{}] * 16, reference=real)
    value = metric(samples)
    stock = _processed_features(folder, generated, clip=clip), _processed_features(folder, real, clip=clip)
    ours = metric.features(generated).double().numpy(), metric.features(real).double().numpy()
    for mine, theirs in zip(ours, stock, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    assert value == pytest.approx(_frechet(*stock), rel=1e-3)  # float32 features; the trace terms cancel
    assert value > 0
    same = EvalSamples(images=real, prompts=["p"] * 16, metadata=[{}] * 16, reference=real)
    assert metric(same) == pytest.approx(0.0, abs=1e-6)


def test_feature_fd_resizes_grayscale_images_of_another_size(dinov2_dir: Path) -> None:
    metric = build_metric("fd_dinov2", options={"model": str(dinov2_dir)}, where="evaluate.metrics.0", assets_dir=None)
    small = torch.rand(6, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    pixels = metric.features.pixel_values(small)
    assert pixels.shape == (6, 3, SIZE, SIZE)
    assert metric(EvalSamples(images=small, prompts=["p"] * 6, metadata=[{}] * 6, reference=small.flip(0))) >= 0


def test_feature_fd_names_the_option_of_a_missing_model_and_needs_real_images(dinov2_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FlowpostError, match=r"^evaluate\.metrics\.2\.options\.model: no model folder"):
        build_metric(
            "fd_clip", options={"model": str(tmp_path / "absent")}, where="evaluate.metrics.2", assets_dir=None
        )
    metric = build_metric("fd_dinov2", options={"model": str(dinov2_dir)}, where="evaluate.metrics.0", assets_dir=None)
    with pytest.raises(FlowpostError, match="needs at least 2 held-out real images"):
        metric(EvalSamples(images=_images(4, 0), prompts=["p"] * 4, metadata=[{}] * 4, reference=None))
