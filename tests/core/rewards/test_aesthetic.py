from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny_clip import PROJECTION, build_tiny_clip

from flowpost.core.evaluation.registry import build_metric
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.core.rewards.aesthetic import AestheticScore, aesthetic_mlp
from flowpost.core.rewards.registry import build_reward
from flowpost.errors import FlowpostError

WHERE = "stages.grpo.rewards.0"


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_clip(tmp_path_factory.mktemp("tiny-clip"))


def _mlp_state(seed: int, embedding_dim: int = PROJECTION) -> dict[str, torch.Tensor]:
    """Random MLP weights under the released file's keys (``layers.N.weight``)."""
    torch.manual_seed(seed)
    return {f"layers.{key}": value.clone() for key, value in aesthetic_mlp(embedding_dim).state_dict().items()}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mlp") / "aesthetic.pth"
    torch.save(_mlp_state(1), path)
    return path


@pytest.fixture(scope="module")
def aesthetic(clip_dir: Path, weights: Path) -> AestheticScore:
    return AestheticScore(str(weights), model=str(clip_dir), batch_size=3)


def _images(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, 3, 40, 48, generator=torch.Generator().manual_seed(seed))


def test_the_mlp_has_the_predictor_layout() -> None:
    mlp = aesthetic_mlp(768)
    shapes = {key: tuple(value.shape) for key, value in mlp.state_dict().items() if key.endswith("weight")}
    assert shapes == {
        "0.weight": (1024, 768),
        "2.weight": (128, 1024),
        "4.weight": (64, 128),
        "6.weight": (16, 64),
        "7.weight": (1, 16),
    }
    assert [module.p for module in mlp if isinstance(module, torch.nn.Dropout)] == [0.2, 0.2, 0.1]


def test_scores_are_the_mlp_on_normalised_embeddings(aesthetic: AestheticScore, weights: Path) -> None:
    """Against CLIPModel's own normalised image embeddings and the weights applied by hand (no activations)."""
    media = _images(4)
    scores = aesthetic(media, ["a"] * 4, [{}] * 4)
    assert scores.shape == (4,) and scores.dtype == torch.float32 and scores.isfinite().all()
    with torch.no_grad():
        outputs = aesthetic.model(pixel_values=aesthetic.pixel_values(media), **aesthetic.text_inputs(["a"] * 4))
        x = outputs.image_embeds
        assert torch.allclose(x.norm(dim=-1), torch.ones(4))
        state = torch.load(weights, weights_only=True)
        for index in (0, 2, 4, 6, 7):
            x = x @ state[f"layers.{index}.weight"].T + state[f"layers.{index}.bias"]
    torch.testing.assert_close(scores, x.squeeze(-1), atol=1e-5, rtol=1e-5)


def test_the_embedding_scale_does_not_matter(clip_dir: Path, weights: Path) -> None:
    scorer = AestheticScore(str(weights), model=str(clip_dir))
    media = _images(2, seed=1)
    before = scorer(media, ["a", "b"], [{}, {}])
    with torch.no_grad():
        scorer.model.visual_projection.weight.mul_(7.0)
    torch.testing.assert_close(scorer(media, ["a", "b"], [{}, {}]), before, atol=1e-5, rtol=1e-5)


def test_deterministic_and_batch_independent(aesthetic: AestheticScore, clip_dir: Path, weights: Path) -> None:
    media = _images(5, seed=2)
    scores = aesthetic(media, ["x"] * 5, [{}] * 5)  # batch_size 3: two forward passes
    torch.testing.assert_close(aesthetic(media, ["x"] * 5, [{}] * 5), scores, rtol=0, atol=0)
    single = torch.cat([aesthetic(image[None], ["x"], [{}]) for image in media])
    torch.testing.assert_close(single, scores, atol=1e-5, rtol=1e-5)
    again = AestheticScore(str(weights), model=str(clip_dir), batch_size=5)
    torch.testing.assert_close(again(media, ["y"] * 5, [{}] * 5), scores, atol=1e-5, rtol=1e-5)
    assert len(set(scores.tolist())) == 5
    assert aesthetic(torch.zeros(0, 3, 32, 32), [], []).shape == (0,)


def test_safetensors_weights_without_the_prefix(aesthetic: AestheticScore, clip_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "mlp.safetensors"
    save_file({key.removeprefix("layers."): value for key, value in _mlp_state(1).items()}, str(path))
    scorer = AestheticScore(str(path), model=str(clip_dir))
    media = _images(2, seed=3)
    torch.testing.assert_close(scorer(media, ["a"] * 2, [{}] * 2), aesthetic(media, ["a"] * 2, [{}] * 2))


def test_bad_weights_name_the_option(clip_dir: Path, tmp_path: Path) -> None:
    wide = tmp_path / "wide.pth"
    torch.save(_mlp_state(0, embedding_dim=768), wide)
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a torch file")
    for path, message in [
        (tmp_path / "missing.pth", "no file at"),
        (wide, "16-dimensional CLIP embeddings"),
        (garbage, "cannot read"),
    ]:
        with pytest.raises(FlowpostError, match=message) as info:
            build_reward("aesthetic", options={"weights": str(path), "model": str(clip_dir)}, where=WHERE)
        assert info.value.where == f"{WHERE}.options.weights"
    with pytest.raises(FlowpostError) as info:
        build_reward("aesthetic", options={"weights": str(wide), "model": str(tmp_path / "nothing")}, where=WHERE)
    assert info.value.where == f"{WHERE}.options.model"


def test_aesthetic_is_a_reward_and_a_metric(aesthetic: AestheticScore, clip_dir: Path, weights: Path) -> None:
    options = {"weights": str(weights), "model": str(clip_dir)}
    assert isinstance(build_reward("aesthetic", options=options, where=WHERE), AestheticScore)
    metric = build_metric("aesthetic", options=options, where="evaluate.metrics.0", assets_dir=None)
    media = _images(3, seed=4)
    samples = EvalSamples(images=media, prompts=["a"] * 3, metadata=[{}] * 3)
    assert metric.name == "aesthetic"
    assert metric(samples) == pytest.approx(float(aesthetic(media, ["a"] * 3, [{}] * 3).mean()), abs=1e-5)
