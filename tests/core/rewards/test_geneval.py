"""``geneval`` through its real code path: a tiny DETR saved locally (every query sure of one cat at one box) and
the tiny random CLIP, built by the reward registry, scored as a stage reward and as an evaluation metric."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tiny_clip import build_tiny_clip
from tiny_detr import LABELS, QUERIES, build_tiny_detr

from flowpost.core.config.schema import RewardConfig
from flowpost.core.evaluation.registry import build_metric, metric_metadata_fields
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.core.rewards.geneval import GenevalReward
from flowpost.core.rewards.geneval_metadata import COLORS
from flowpost.core.rewards.registry import build_reward
from flowpost.errors import FlowpostError
from flowpost.stage import build_rewards

SIZE = 32
CAT_BOX = (0.25, 0.5, 0.3, 0.3)  # relative centre x, y, width, height
WHERE = "stages.grpo.rewards.0"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("geneval-models")
    return {
        "detector": str(build_tiny_detr(root / "detr", sure=("cat", CAT_BOX))),
        "clip": str(build_tiny_clip(root / "clip")),
    }


@pytest.fixture(scope="module")
def reward(models: dict[str, str]) -> GenevalReward:
    return build_reward("geneval", options={**models, "batch_size": 2}, where=WHERE)


def _images(batch: int) -> torch.Tensor:
    return torch.rand(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))


def _cats(count: int, **extra: Any) -> dict[str, Any]:
    return {"tag": "counting" if count > 1 else "single_object", "include": [{"class": "cat", "count": count, **extra}]}


def test_the_detector_finds_a_cat_per_query_at_its_box(reward: GenevalReward) -> None:
    assert reward.classes == {i: label for i, label in enumerate(LABELS) if label not in ("N/A", "mouse")} | {
        5: "computer mouse"
    }
    detections = reward.detect(_images(3))
    expected = [SIZE * v for v in (0.25 - 0.15, 0.5 - 0.15, 0.25 + 0.15, 0.5 + 0.15)]
    for found in detections:
        assert list(found) == ["cat"] and len(found["cat"]) == QUERIES
        for score, box in found["cat"]:
            assert score > 0.99
            assert box == pytest.approx(expected, abs=1e-3)


def test_partial_and_strict_scores_follow_the_detected_cats(models: dict[str, str], reward: GenevalReward) -> None:
    metadata = [
        _cats(1),
        _cats(QUERIES),
        _cats(QUERIES // 2),
        {"tag": "single_object", "include": [{"class": "dog", "count": 1}]},
        {**_cats(1), "exclude": [{"class": "cat", "count": 2}]},
    ]
    media = _images(len(metadata))
    prompts = [f"prompt {i}" for i in range(len(metadata))]
    partial = reward(media, prompts, metadata)
    assert partial.dtype == torch.float32 and partial.device == media.device
    assert partial.tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0, 0.0])  # six cats found each time
    strict = build_reward("geneval", options={**models, "strict": True}, where=WHERE)(media, prompts, metadata)
    assert strict.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    one_cat = build_reward("geneval", options={**models, "max_overlap": 0.5}, where=WHERE)
    assert one_cat(media, prompts, metadata).tolist() == pytest.approx([1.0, 1 / 6, 1 / 3, 0.0, 1.0])
    unsure = build_reward("geneval", options={**models, "threshold": 1.0, "strict": True}, where=WHERE)
    assert unsure(media[:1], prompts[:1], metadata[:1]).tolist() == [0.0]


def test_the_colour_check_reads_clip_on_the_cat_crop(models: dict[str, str]) -> None:
    reward = build_reward("geneval", options={**models, "max_overlap": 0.5}, where=WHERE)
    media = _images(1)
    (found,) = reward.detect(media)
    colour = reward.colour_classifier(media[0])([found["cat"][0][1]], "cat")[0]
    other = next(c for c in COLORS if c != colour)
    scores = reward(media.expand(2, -1, -1, -1), ["a", "b"], [_cats(1, color=colour), _cats(1, color=other)])
    assert scores.tolist() == pytest.approx([1.0, 0.5])  # the count, and the colour when it is the one found


def test_bad_metadata_and_unknown_classes_are_errors_naming_the_prompt(reward: GenevalReward) -> None:
    with pytest.raises(FlowpostError, match="prompt 'a cat': GenEval metadata needs 'tag'"):
        reward(_images(1), ["a cat"], [{}])
    bench = {"tag": "single_object", "include": [{"class": "bench", "count": 1}]}
    with pytest.raises(FlowpostError, match="asks for 'bench', which the detector does not detect"):
        reward(_images(1), ["a bench"], [bench])


@pytest.mark.parametrize(
    ("options", "where"),
    [
        ({"threshold": 1.5}, "options.threshold"),
        ({"strict": "yes"}, "options.strict"),
        ({"max_objects": 0}, "options.max_objects"),
        ({"dtype": "int8"}, "options.dtype"),
        ({"detector": "/no/such/folder"}, "options.detector"),
        ({"clip": "/no/such/folder"}, "options.clip"),
        ({"clip_processor": "/no/such/folder"}, "options.clip_processor"),
    ],
)
def test_bad_options_name_their_path(models: dict[str, str], options: dict[str, Any], where: str) -> None:
    with pytest.raises(FlowpostError) as raised:
        build_reward("geneval", options={**models, **options}, where=WHERE)
    assert raised.value.where == f"{WHERE}.{where}"


def test_a_detector_without_coco_classes_is_refused(tmp_path: Path, models: dict[str, str]) -> None:
    from transformers import AutoConfig

    folder = build_tiny_detr(tmp_path / "detr")
    config = AutoConfig.from_pretrained(folder)
    config.id2label = {i: f"part {i}" for i in config.id2label}
    config.save_pretrained(folder)
    with pytest.raises(FlowpostError, match="none of GenEval's COCO class names"):
        build_reward("geneval", options={**models, "detector": str(folder)}, where=WHERE)


def test_a_stage_whose_prompts_lack_the_metadata_is_refused_naming_dataset_and_field(models: dict[str, str]) -> None:
    configs = [RewardConfig(name="geneval", options=models)]
    spec = SimpleNamespace(stage="grpo", config={"data": {"dataset": "coco_prompts"}})
    inputs = SimpleNamespace(assets_dir=None, prompts=[("a cat", _cats(1)), ("a dog", {"tag": "single_object"})])
    with pytest.raises(FlowpostError, match="'include' of every prompt, and prompt 'a dog' of dataset 'coco_prompts'"):
        build_rewards(configs, spec, inputs)
    inputs.prompts = inputs.prompts[:1]
    assert build_rewards(configs, spec, inputs).weights == {"geneval": 1.0}


def test_geneval_is_an_evaluation_metric(models: dict[str, str], reward: GenevalReward) -> None:
    metric = build_metric("geneval", options=models, where="evaluate.metrics.0", assets_dir=None)
    assert metric_metadata_fields("geneval", where="evaluate.metrics.0") == ("tag", "include")
    metadata = [_cats(QUERIES), _cats(1), _cats(QUERIES)]
    samples = EvalSamples(images=_images(3), prompts=["a", "b", "c"], metadata=metadata)
    assert metric.name == "geneval"
    assert metric(samples) == pytest.approx(2 / 3)


def test_half_precision_models_give_the_same_verdicts_as_float32(models: dict[str, str], reward: GenevalReward) -> None:
    half = build_reward("geneval", options={**models, "dtype": "bfloat16", "batch_size": 2}, where=WHERE)
    assert half.detector.dtype == torch.bfloat16 and half.clip.model.dtype == torch.bfloat16
    metadata = [_cats(1), _cats(QUERIES), {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}]
    media = _images(3)
    scores = half(media, ["a", "b", "c"], metadata)
    assert scores.dtype == torch.float32
    assert scores.tolist() == reward(media, ["a", "b", "c"], metadata).tolist()
