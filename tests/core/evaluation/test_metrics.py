"""The metric registry: the digits judge, reward scorers as metrics, and the errors of bad entries."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from PIL import Image

from flowpost.core.evaluation.frechet import frechet_distance
from flowpost.core.evaluation.registry import METRICS, build_metric
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.core.registries import registry
from flowpost.core.rewards.registry import REWARDS
from flowpost.errors import FlowpostError
from flowpost_digits.classifier import JUDGE_CLASSIFIER, REWARD_CLASSIFIER, DigitClassifier, save_classifier


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random judge and reward classifiers saved as a digits acquisition saves them."""
    folder = tmp_path_factory.mktemp("assets")
    for spec in (JUDGE_CLASSIFIER, REWARD_CLASSIFIER):
        torch.manual_seed(spec.seed)
        save_classifier(DigitClassifier(width=spec.width), folder, spec.name)
    return folder


def _digits(n: int, seed: int = 0) -> EvalSamples:
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 1, 16, 16, generator=generator)
    labels = torch.randint(0, 10, (n,), generator=generator).tolist()
    reference = torch.rand(n + 3, 1, 16, 16, generator=generator)
    return EvalSamples(images, [f"digit {d}" for d in labels], [{"label": d} for d in labels], reference)


def test_every_reward_and_metric_is_a_metric_name() -> None:
    digits = {"adherence", "fd", "digit_adherence"}  # the entry points of the digits extra
    assert list(registry("metrics")) == sorted({*METRICS, *REWARDS, *digits})  # what `flowpost list metrics` prints
    assert not set(METRICS) & set(REWARDS)


def test_the_judge_metrics_match_the_judge_run_by_hand(assets: Path) -> None:
    samples = _digits(40)
    judge = DigitClassifier(width=JUDGE_CLASSIFIER.width)
    judge.load_state_dict(safetensors.torch.load_file(assets / "digits-judge.safetensors"))
    judge.eval()
    with torch.no_grad():
        predictions = judge(samples.images).argmax(-1).tolist()
        expected_fd = frechet_distance(judge.features(samples.images), judge.features(samples.reference))
    labels = [meta["label"] for meta in samples.metadata]
    expected = sum(p == label for p, label in zip(predictions, labels, strict=True)) / len(labels)
    adherence = build_metric("adherence", options={}, where="evaluate.metrics.0", assets_dir=assets)
    assert adherence(samples) == pytest.approx(expected)
    assert build_metric("fd", options={}, where="evaluate.metrics.2", assets_dir=assets)(samples) == expected_fd


def test_the_reward_classifier_as_a_metric_is_its_mean_probability_of_the_label(assets: Path) -> None:
    samples = _digits(12, seed=1)
    reward = DigitClassifier(width=REWARD_CLASSIFIER.width)
    reward.load_state_dict(safetensors.torch.load_file(assets / "digits-reward.safetensors"))
    with torch.no_grad():
        probabilities = reward.eval()(samples.images).softmax(-1).numpy()
    expected = np.mean([probabilities[i, meta["label"]] for i, meta in enumerate(samples.metadata)])
    metric = build_metric("digit_adherence", options={}, where="evaluate.metrics.1", assets_dir=assets)
    assert metric.name == "digit_adherence" and metric(samples) == pytest.approx(float(expected), rel=1e-6)


def test_a_jpeg_reward_as_a_metric_is_the_mean_pil_jpeg_size() -> None:
    samples = _digits(5, seed=2)
    sizes = []
    for image in samples.images:
        buffer = io.BytesIO()
        Image.fromarray((image[0] * 255).round().byte().numpy()).save(buffer, format="JPEG", quality=95)
        sizes.append(len(buffer.getvalue()) / 1000)
    metric = build_metric("jpeg_incompressibility", options={}, where="evaluate.metrics.0", assets_dir=None)
    assert metric(samples) == pytest.approx(float(np.mean(sizes)), rel=1e-6)


def test_a_classifier_metric_without_digits_assets_says_what_to_do() -> None:
    expected = r"^evaluate\.metrics\.3: metric 'fd' reads the assets its dataset's acquisition writes"
    with pytest.raises(FlowpostError, match=expected):
        build_metric("fd", options={}, where="evaluate.metrics.3", assets_dir=None)


def test_bad_options_and_unknown_names_name_the_entry() -> None:
    with pytest.raises(FlowpostError, match=r"^evaluate\.metrics\.0: bad options for metric 'brightness'"):
        build_metric("brightness", options={"gamma": 2}, where="evaluate.metrics.0", assets_dir=None)
    with pytest.raises(FlowpostError, match=r"^evaluate\.metrics\.1\.options\.cutoff: cutoff must be a number"):
        build_metric("high_frequency", options={"cutoff": -1}, where="evaluate.metrics.1", assets_dir=None)
    with pytest.raises(FlowpostError, match=r"evaluate\.metrics\.2: unknown metric 'saturaton' \(did you mean"):
        build_metric("saturaton", options={}, where="evaluate.metrics.2", assets_dir=None)


def test_the_judge_needs_a_label_on_every_prompt(assets: Path) -> None:
    samples = _digits(4)
    unlabeled = EvalSamples(samples.images, samples.prompts, [{"label": 1}, {}, {}, {}], samples.reference)
    metric = build_metric("adherence", options={}, where="evaluate.metrics.0", assets_dir=assets)
    with pytest.raises(FlowpostError, match=r"^evaluate\.dataset: adherence needs a digit 0-9 as every"):
        metric(unlabeled)
