"""The hpsv2 reward on a tiny random open_clip checkpoint, against open_clip's forward pass on the raw tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny_open_clip import TEXT, build_tiny_open_clip, encode_image, encode_text
from torch.nn import functional as F

from flowpost.core.evaluation.registry import build_metric
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.core.rewards.hps import HpsV2
from flowpost.core.rewards.open_clip_checkpoint import clip_config, open_clip_architecture
from flowpost.core.rewards.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, square_inputs
from flowpost.core.rewards.registry import build_reward
from flowpost.errors import FlowpostError

WHERE = "stages.grpo.rewards.0"
PROMPTS = ["a red cat", "seven", "the digit three written twice on a wall at night"]  # the last is truncated


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_tiny_open_clip(tmp_path_factory.mktemp("tiny-open-clip"))


def _options(files: dict[str, Path], **extra: object) -> dict[str, object]:
    return {
        "checkpoint": str(files["checkpoint"]),
        "model": str(files["config"]),
        "tokenizer": str(files["tokenizer"]),
    } | extra


@pytest.fixture(scope="module")
def hps(files: dict[str, Path]) -> HpsV2:
    return HpsV2(**_options(files, batch_size=2))


def _images(batch: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, 3, 40, 48, generator=torch.Generator().manual_seed(seed))


def _open_clip_tokens(hps: HpsV2, prompts: list[str]) -> torch.Tensor:
    """open_clip's tokens: zero-padded to the context length, cut to it with the end-of-text token last."""
    ids = torch.zeros(len(prompts), TEXT["context_length"], dtype=torch.long)
    for row, prompt in enumerate(prompts):
        tokens = hps.tokenizer(prompt)["input_ids"][: TEXT["context_length"]]
        tokens[-1] = hps.tokenizer.eos_token_id
        ids[row, : len(tokens)] = torch.tensor(tokens)
    return ids


def test_scores_are_the_cosine_of_open_clip_features(hps: HpsV2, files: dict[str, Path]) -> None:
    """img_score.py's ``image_features @ text_features.T`` of normalised features, from the checkpoint's tensors."""
    media = _images(3)
    scores = hps(media, PROMPTS, [{}] * 3)  # batch_size 2: two forward passes
    assert scores.shape == (3,) and scores.dtype == torch.float32
    assert len(hps.tokenizer(PROMPTS[2])["input_ids"]) > TEXT["context_length"]
    state = torch.load(files["checkpoint"], weights_only=True)["state_dict"]
    pixels = square_inputs(media, 32, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, reward="hpsv2")
    image = F.normalize(encode_image(state, pixels), dim=-1)
    text = F.normalize(encode_text(state, _open_clip_tokens(hps, PROMPTS)), dim=-1)
    torch.testing.assert_close(scores, (image @ text.T).diagonal(), atol=1e-5, rtol=1e-5)
    assert scores.abs().max() <= 1 and scores.abs().min() > 1e-3


def test_the_prompt_changes_the_score(hps: HpsV2) -> None:
    scores = hps(_images(1).expand(3, -1, -1, -1), PROMPTS, [{}] * 3)
    assert len(set(scores.tolist())) == 3


def test_deterministic_and_batch_independent(hps: HpsV2, files: dict[str, Path]) -> None:
    media, prompts = _images(5, seed=1), ["seven", "a cat", "a dog", "nine", "red"]
    scores = hps(media, prompts, [{}] * 5)
    torch.testing.assert_close(hps(media, prompts, [{}] * 5), scores, rtol=0, atol=0)
    single = torch.cat([hps(image[None], [prompt], [{}]) for image, prompt in zip(media, prompts, strict=True)])
    torch.testing.assert_close(single, scores, atol=1e-5, rtol=1e-5)
    assert hps(torch.zeros(0, 3, 32, 32), [], []).shape == (0,)
    grey = media[:, :1]
    torch.testing.assert_close(hps(grey, prompts, [{}] * 5), hps(grey.expand(-1, 3, -1, -1), prompts, [{}] * 5))


def test_half_precision_scores_are_float32_and_close(hps: HpsV2, files: dict[str, Path]) -> None:
    half = HpsV2(**_options(files, dtype="bfloat16"))
    assert {parameter.dtype for parameter in half.model.parameters()} == {torch.bfloat16}
    media = _images(3, seed=2)
    scores = half(media, PROMPTS, [{}] * 3)
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, hps(media, PROMPTS, [{}] * 3), atol=0.05, rtol=0)


def test_a_plain_state_dict_in_safetensors_loads(hps: HpsV2, files: dict[str, Path], tmp_path: Path) -> None:
    state = torch.load(files["checkpoint"], weights_only=True)["state_dict"]
    save_file(state, str(tmp_path / "hps.safetensors"))
    scorer = HpsV2(**_options(files, checkpoint=str(tmp_path / "hps.safetensors")))
    media = _images(2, seed=3)
    torch.testing.assert_close(scorer(media, PROMPTS[:2], [{}] * 2), hps(media, PROMPTS[:2], [{}] * 2))


def test_the_built_in_architecture_is_open_clip_vit_h_14() -> None:
    architecture = open_clip_architecture("ViT-H-14")
    assert (architecture.vision_heads, architecture.vision_mlp, architecture.text_heads, architecture.text_mlp) == (
        16,
        5120,
        16,
        4096,
    )
    config = clip_config(architecture, {"bos_token_id": 49406, "eos_token_id": 49407, "pad_token_id": 0})
    vision, text = config.vision_config, config.text_config
    assert (vision.hidden_size, vision.num_hidden_layers, vision.patch_size, vision.image_size) == (1280, 32, 14, 224)
    assert (text.hidden_size, text.num_hidden_layers, text.max_position_embeddings, text.vocab_size) == (
        1024,
        24,
        77,
        49408,
    )
    assert config.projection_dim == 1024 and vision.hidden_act == text.hidden_act == "gelu"


def test_bad_checkpoints_and_models_name_the_option(files: dict[str, Path], tmp_path: Path) -> None:
    state = torch.load(files["checkpoint"], weights_only=True)["state_dict"]
    torch.save({**state, "visual.attn_pool.weight": torch.zeros(2)}, tmp_path / "extra.pt")
    torch.save({key: value for key, value in state.items() if "resblocks.1." not in key}, tmp_path / "short.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a torch file")
    config = json.loads(files["config"].read_text())
    (tmp_path / "wide.json").write_text(json.dumps({**config, "embed_dim": 32}))
    (tmp_path / "timm.json").write_text(json.dumps({**config, "vision_cfg": {"timm_model_name": "vit"}}))
    for options, option, message in [
        ({"checkpoint": str(tmp_path / "missing.pt")}, "checkpoint", "no file at"),
        ({"checkpoint": str(tmp_path / "garbage.pt")}, "checkpoint", "cannot read"),
        ({"checkpoint": str(tmp_path / "extra.pt")}, "checkpoint", "unexpected tensor 'visual.attn_pool.weight'"),
        ({"checkpoint": str(tmp_path / "short.pt")}, "checkpoint", "tensors missing or of another shape"),
        ({"model": str(tmp_path / "wide.json")}, "checkpoint", "does not fit options.model"),
        ({"model": "ViT-Q-99"}, "model", "neither a known architecture"),
        ({"model": str(tmp_path / "timm.json")}, "model", "vision_cfg.timm_model_name"),
        ({"tokenizer": str(tmp_path / "nothing")}, "tokenizer", "no model folder"),
        ({"dtype": "float64"}, "dtype", "float32, float16, bfloat16"),
        ({"batch_size": 0}, "batch_size", "positive integer"),
        ({"device": "gpu7"}, "device", "torch device"),
    ]:
        with pytest.raises(FlowpostError, match=message) as info:
            build_reward("hpsv2", options=_options(files, **options), where=WHERE)
        assert info.value.where == f"{WHERE}.options.{option}"


def test_hpsv2_is_a_reward_and_a_metric(hps: HpsV2, files: dict[str, Path]) -> None:
    assert isinstance(build_reward("hpsv2", options=_options(files), where=WHERE), HpsV2)
    metric = build_metric("hpsv2", options=_options(files), where="evaluate.metrics.0", assets_dir=None)
    media = _images(3, seed=4)
    samples = EvalSamples(images=media, prompts=PROMPTS, metadata=[{}] * 3)
    assert metric.name == "hpsv2"
    assert metric(samples) == pytest.approx(float(hps(media, PROMPTS, [{}] * 3).mean()), abs=1e-5)
