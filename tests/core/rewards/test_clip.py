from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_clip import STD, build_tiny_clip
from torch.nn import functional as F
from transformers import AutoImageProcessor
from transformers.models.clip.modeling_clip import CLIPOutput

from flowpost.core.config.loading import load_pipeline
from flowpost.core.config.schema import RewardConfig
from flowpost.core.rewards.clip import ClipScore, ClipSimilarity, PickScore
from flowpost.core.rewards.registry import build_reward
from flowpost.errors import FlowpostError
from flowpost.stage import build_rewards

PROMPTS = ["a photo of 7", "the digit 3", "zero"]
WHERE = "stages.grpo.rewards.0"


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_clip(tmp_path_factory.mktemp("tiny-clip"))


@pytest.fixture(scope="module")
def pickscore(clip_dir: Path) -> PickScore:
    return PickScore(str(clip_dir), batch_size=2)


def _digits(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, 1, 16, 16, generator=torch.Generator().manual_seed(seed))


def _reference_outputs(scorer: ClipSimilarity, media: torch.Tensor, prompts: list[str]) -> CLIPOutput:
    """The full CLIP forward pass over the scorer's inputs: normalised embeddings and scaled logits."""
    with torch.no_grad():
        return scorer.model(pixel_values=scorer.pixel_values(media), **scorer.text_inputs(prompts))


def test_scores_match_the_model_outputs(clip_dir: Path, pickscore: PickScore) -> None:
    media = _digits(3)
    clip_score = ClipScore(str(clip_dir), batch_size=2)
    outputs = _reference_outputs(pickscore, media, PROMPTS)
    cosine = (outputs.image_embeds * outputs.text_embeds).sum(-1)
    for scorer, expected in [
        (pickscore, outputs.logits_per_image.diagonal()),
        (clip_score, 100 * cosine.clamp_min(0)),
    ]:
        scores = scorer(media, PROMPTS, [{}] * 3)
        assert scores.shape == (3,) and scores.dtype == torch.float32 and scores.isfinite().all()
        torch.testing.assert_close(scores, expected, atol=1e-4, rtol=1e-4)
    assert float(pickscore.model.logit_scale.exp()) == pytest.approx(float(outputs.logits_per_image[0, 0] / cosine[0]))


def test_the_prompt_changes_the_score(pickscore: PickScore) -> None:
    media = _digits(1).expand(3, -1, -1, -1)
    scores = pickscore(media, PROMPTS, [{}] * 3)
    assert len(set(scores.tolist())) == 3
    assert pickscore(torch.zeros(0, 1, 16, 16), [], []).shape == (0,)


def test_an_aligned_prompt_scores_highest(clip_dir: Path) -> None:
    """Projections chosen so the image embedding equals the first prompt's and is orthogonal to the second's."""
    scorers = [PickScore(str(clip_dir)), ClipScore(str(clip_dir))]
    media, prompts = _digits(1, seed=1).expand(2, -1, -1, -1), ["seven", "a cat"]
    for scorer in scorers:
        model = scorer.model
        with torch.no_grad():
            image = model.visual_projection(model.vision_model(pixel_values=scorer.pixel_values(media)).pooler_output)
            text = model.text_model(**scorer.text_inputs(prompts)).pooler_output
            orthogonal = torch.randn(image.shape[1], generator=torch.Generator().manual_seed(2))
            orthogonal -= (orthogonal @ image[0]) / (image[0] @ image[0]) * image[0]
            targets = torch.stack([image[0], orthogonal], dim=1)
            model.text_projection.weight.copy_(targets @ torch.linalg.pinv(text.T))
    pick, clip = (scorer(media, prompts, [{}, {}]) for scorer in scorers)
    scale = float(scorers[0].model.logit_scale.exp())
    torch.testing.assert_close(pick, torch.tensor([scale, 0.0]), atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(clip, torch.tensor([100.0, 0.0]), atol=1e-2, rtol=1e-4)


@pytest.mark.parametrize("shape", [(2, 1, 16, 16), (2, 3, 20, 12), (2, 3, 40, 64)])
def test_pixels_follow_the_image_processor(clip_dir: Path, pickscore: PickScore, shape: tuple[int, ...]) -> None:
    """Torch preprocessing against the transformers processor on smooth 8-bit images, up to 8-bit rounding."""
    coarse = torch.rand(shape[0], shape[1], 5, 4, generator=torch.Generator().manual_seed(3))
    media = (F.interpolate(coarse, size=shape[2:], mode="bilinear") * 255).round() / 255
    arrays = [(image.expand(3, -1, -1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy() for image in media]
    expected = AutoImageProcessor.from_pretrained(clip_dir)(images=arrays, return_tensors="pt")["pixel_values"]
    ours = pickscore.pixel_values(media)
    assert ours.shape == expected.shape == (2, 3, 32, 32)
    error = (ours - expected) * torch.tensor(STD).view(1, 3, 1, 1) * 255
    assert error.abs().mean() < 0.5 and error.abs().max() < 1.5


def test_bad_media_and_prompt_counts_are_rejected(pickscore: PickScore) -> None:
    with pytest.raises(FlowpostError, match="grayscale or RGB"):
        pickscore(torch.zeros(1, 4, 16, 16), ["x"], [{}])
    with pytest.raises(FlowpostError, match="2 images and 1 prompts"):
        pickscore(torch.zeros(2, 1, 16, 16), ["x"], [{}, {}])


@pytest.mark.parametrize(
    ("options", "option", "message"),
    [
        ({"model": "{missing}"}, "model", "no model folder"),
        ({"model": "{empty}"}, "model", "cannot load CLIPModel"),
        ({"model": "{clip}", "processor": "{missing}"}, "processor", "no model folder"),
        ({"model": "{clip}", "dtype": "float64"}, "dtype", "float32, float16, bfloat16"),
        ({"model": "{clip}", "batch_size": 0}, "batch_size", "positive integer"),
        ({"model": "{clip}", "device": "gpu7"}, "device", "torch device"),
    ],
)
def test_bad_options_name_the_config_path(
    clip_dir: Path, tmp_path: Path, options: dict[str, object], option: str, message: str
) -> None:
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "clip": clip_dir}
    options = {key: value.format(**paths) if isinstance(value, str) else value for key, value in options.items()}
    with pytest.raises(FlowpostError, match=message) as info:
        build_reward("clip_score", options=options, where=WHERE)
    assert info.value.where == f"{WHERE}.options.{option}"


def test_the_pipeline_builds_both_rewards_by_name(clip_dir: Path, tmp_path: Path) -> None:
    configs = [
        RewardConfig(name="clip_score", options={"model": str(clip_dir)}),
        RewardConfig(name="pickscore", weight=0.5, options={"model": str(clip_dir), "processor": str(clip_dir)}),
    ]
    rewards = build_rewards(configs, SimpleNamespace(stage="grpo"), SimpleNamespace(assets_dir=tmp_path))
    built = [(type(selection.reward), weight) for selection, weight in rewards.components]  # each in its FrameSelection
    assert built == [(ClipScore, 1.0), (PickScore, 0.5)]
    output = rewards(_digits(3), PROMPTS, [{}] * 3)
    torch.testing.assert_close(output.total, output.components["clip_score"] + 0.5 * output.components["pickscore"])


def test_the_validator_accepts_clip_rewards(clip_dir: Path) -> None:
    rewards = f"[{{name: clip_score, options: {{model: {clip_dir}}}}}, {{name: pickscore, options: {{model: x/y}}}}]"
    pipeline = load_pipeline(None, [f"stages.grpo.rewards={rewards}"])
    assert [(r.name, r.options["model"]) for r in pipeline.stages["grpo"].rewards] == [
        ("clip_score", str(clip_dir)),
        ("pickscore", "x/y"),
    ]
