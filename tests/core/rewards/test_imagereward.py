"""The imagereward reward on a tiny random checkpoint in the released layout, against BLIP's forward pass on
the raw tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_image_reward import HEADS, IMAGE_SIZE, LAYERS, PATCH, POSITIONS, build_tiny_image_reward, reference_scores

from flowpost.core.evaluation.registry import build_metric
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.core.rewards.imagereward import ImageReward
from flowpost.core.rewards.imagereward_model import blip_configs, imagereward_state_dict
from flowpost.core.rewards.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, square_inputs
from flowpost.core.rewards.registry import build_reward
from flowpost.errors import FlowpostError

WHERE = "stages.grpo.rewards.0"
PROMPTS = ["a photo of a red cat", "the digit seven", "a blue dog in snow"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_tiny_image_reward(tmp_path_factory.mktemp("tiny-image-reward"))


@pytest.fixture(scope="module")
def state(files: dict[str, Path]) -> dict[str, torch.Tensor]:
    return torch.load(files["checkpoint"], weights_only=True)


def _options(files: dict[str, Path], **extra: object) -> dict[str, object]:
    return {"checkpoint": str(files["checkpoint"]), "tokenizer": str(files["tokenizer"])} | extra


@pytest.fixture(scope="module")
def reward(files: dict[str, Path]) -> ImageReward:
    return ImageReward(**_options(files, batch_size=2))


def _images(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, 3, 40, 48, generator=torch.Generator().manual_seed(seed))


def test_the_key_mapping_covers_the_released_layout(state: dict[str, torch.Tensor]) -> None:
    converted = imagereward_state_dict(state)
    assert converted["vision_model.embeddings.class_embedding"] is state["blip.visual_encoder.cls_token"]
    assert (
        converted["vision_model.encoder.layers.1.self_attn.qkv.weight"]
        is state["blip.visual_encoder.blocks.1.attn.qkv.weight"]
    )
    assert (
        converted["vision_model.encoder.layers.0.self_attn.projection.bias"]
        is state["blip.visual_encoder.blocks.0.attn.proj.bias"]
    )
    assert converted["vision_model.post_layernorm.weight"] is state["blip.visual_encoder.norm.weight"]
    key = "encoder.layer.1.crossattention.self.key.weight"
    assert converted[f"text_encoder.{key}"] is state[f"blip.text_encoder.{key}"]
    assert converted["mlp.7.bias"] is state["mlp.layers.7.bias"]
    dropped = {"blip.vision_proj.weight", "blip.vision_proj.bias", "blip.text_proj.weight", "blip.text_proj.bias"}
    assert len(converted) == len(state) - len(dropped) - 1  # and the text encoder's position_ids buffer
    with pytest.raises(KeyError, match="blip.itm_head.weight"):
        imagereward_state_dict({**state, "blip.itm_head.weight": torch.zeros(2, 2)})


def test_the_architecture_is_read_from_the_tensors(state: dict[str, torch.Tensor]) -> None:
    vision, text = blip_configs(imagereward_state_dict(state), pad_token_id=0)
    assert (vision.image_size, vision.patch_size, vision.num_hidden_layers, vision.num_attention_heads) == (
        IMAGE_SIZE,
        PATCH,
        LAYERS,
        HEADS,
    )
    assert (text.num_hidden_layers, text.num_attention_heads, text.max_position_embeddings) == (
        LAYERS,
        HEADS,
        POSITIONS,
    )
    assert (vision.layer_norm_eps, text.layer_norm_eps, text.encoder_hidden_size) == (1e-6, 1e-12, 128)


def test_scores_follow_the_reference_forward_pass(reward: ImageReward, state: dict[str, torch.Tensor]) -> None:
    """(mlp(BERT(prompt | image)[CLS]) - mean) / std, computed on the released names by hand."""
    media = _images(3)
    scores = reward(media, PROMPTS, [{}] * 3)  # batch_size 2: two forward passes
    assert scores.shape == (3,) and scores.dtype == torch.float32 and scores.isfinite().all()
    tokens = reward.text_inputs(PROMPTS)
    assert tokens["input_ids"].shape == (3, 35) and tokens["input_ids"][0, 0] == reward.tokenizer.cls_token_id
    pixels = square_inputs(media, IMAGE_SIZE, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, reward="imagereward")
    expected = reference_scores(state, pixels, tokens["input_ids"], tokens["attention_mask"])
    torch.testing.assert_close(scores, expected, atol=1e-4, rtol=1e-4)


def test_the_prompt_and_the_image_change_the_score(reward: ImageReward) -> None:
    by_prompt = reward(_images(1).expand(3, -1, -1, -1), PROMPTS, [{}] * 3)
    by_image = reward(_images(3, seed=1), [PROMPTS[0]] * 3, [{}] * 3)
    assert len(set(by_prompt.tolist())) == 3 and len(set(by_image.tolist())) == 3


def test_deterministic_and_batch_independent(reward: ImageReward) -> None:
    media = _images(5, seed=2)
    prompts = ["a red cat", "a dog", "seven", "snow", "a photo"]
    scores = reward(media, prompts, [{}] * 5)
    torch.testing.assert_close(reward(media, prompts, [{}] * 5), scores, rtol=0, atol=0)
    single = torch.cat([reward(image[None], [prompt], [{}]) for image, prompt in zip(media, prompts, strict=True)])
    torch.testing.assert_close(single, scores, atol=1e-5, rtol=1e-5)
    assert reward(torch.zeros(0, 3, 32, 32), [], []).shape == (0,)


def test_half_precision_runs_blip_in_it_and_returns_float32(reward: ImageReward, files: dict[str, Path]) -> None:
    half = ImageReward(**_options(files, dtype="bfloat16"))
    assert half.model.vision_model.embeddings.patch_embedding.weight.dtype == torch.bfloat16
    assert half.model.text_encoder.embeddings.word_embeddings.weight.dtype == torch.bfloat16
    assert {parameter.dtype for parameter in half.model.mlp.parameters()} == {torch.float32}
    media = _images(3, seed=3)
    scores = half(media, PROMPTS, [{}] * 3)
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, reward(media, PROMPTS, [{}] * 3), atol=0.1, rtol=0)


def test_bad_options_name_the_option(files: dict[str, Path], state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    torch.save({**state, "blip.itm_head.weight": torch.zeros(2, 2)}, tmp_path / "itm.pt")
    torch.save({key: value for key, value in state.items() if not key.startswith("mlp.")}, tmp_path / "no-mlp.pt")
    odd = {**state, "blip.visual_encoder.cls_token": torch.zeros(1, 1, 96)}
    torch.save(odd, tmp_path / "odd.pt")
    for options, option, message in [
        ({"checkpoint": str(tmp_path / "missing.pt")}, "checkpoint", "no file at"),
        ({"checkpoint": str(tmp_path / "itm.pt")}, "checkpoint", "tensor 'blip.itm_head.weight' unexpected"),
        ({"checkpoint": str(tmp_path / "no-mlp.pt")}, "checkpoint", "tensors missing or of another shape"),
        ({"checkpoint": str(tmp_path / "odd.pt")}, "checkpoint", "64-wide attention heads"),
        ({"tokenizer": str(tmp_path / "nothing")}, "tokenizer", "no model folder"),
        ({"dtype": "int8"}, "dtype", "float32, float16, bfloat16"),
        ({"batch_size": True}, "batch_size", "positive integer"),
    ]:
        with pytest.raises(FlowpostError, match=message) as info:
            build_reward("imagereward", options=_options(files, **options), where=WHERE)
        assert info.value.where == f"{WHERE}.options.{option}"


def test_bad_media_and_prompt_counts_are_refused(reward: ImageReward) -> None:
    with pytest.raises(FlowpostError, match="grayscale or RGB"):
        reward(torch.zeros(1, 2, 16, 16), ["x"], [{}])
    with pytest.raises(FlowpostError, match="2 images and 1 prompts"):
        reward(torch.zeros(2, 3, 16, 16), ["x"], [{}, {}])


def test_imagereward_is_a_reward_and_a_metric(reward: ImageReward, files: dict[str, Path]) -> None:
    assert isinstance(build_reward("imagereward", options=_options(files), where=WHERE), ImageReward)
    metric = build_metric("imagereward", options=_options(files), where="evaluate.metrics.0", assets_dir=None)
    media = _images(3, seed=4)
    samples = EvalSamples(images=media, prompts=PROMPTS, metadata=[{}] * 3)
    assert metric.name == "imagereward"
    assert metric(samples) == pytest.approx(float(reward(media, PROMPTS, [{}] * 3).mean()), abs=1e-5)
