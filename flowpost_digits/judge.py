"""Metrics of the digits judge, a classifier no stage trains on: adherence and the Fréchet distance
of its features to the held-out real digits."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from flowpost.core.evaluation.frechet import frechet_distance
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.errors import FlowpostError
from flowpost_digits.classifier import JUDGE_CLASSIFIER, load_classifier
from flowpost_digits.labels import digit_label


def _labels(samples: EvalSamples, metric: str) -> Tensor:
    try:
        labels = [digit_label(meta.get("label")) for meta in samples.metadata]
    except ValueError as exc:
        raise FlowpostError(
            f"{metric} needs a digit 0-9 as every evaluation prompt's 'label' ({exc}); evaluate on a "
            "builtin-digits dataset",
            where="evaluate.dataset",
        ) from None
    return torch.tensor(labels, device=samples.images.device)


class DigitJudgeAdherence:
    """Fraction of samples whose judge class is the prompted digit."""

    name = "adherence"
    better = "higher"

    def __init__(self, assets_dir: str | Path) -> None:
        self.judge = load_classifier(Path(assets_dir), JUDGE_CLASSIFIER.name)

    @torch.no_grad()
    def __call__(self, samples: EvalSamples) -> float:
        labels = _labels(samples, self.name)
        return float((self.judge(samples.images).argmax(-1) == labels).float().mean())


class DigitJudgeFrechet:
    """Fréchet distance between the judge's penultimate features of the samples and of the real digits."""

    name = "fd"
    better = "lower"
    reads_reference = True

    def __init__(self, assets_dir: str | Path) -> None:
        self.judge = load_classifier(Path(assets_dir), JUDGE_CLASSIFIER.name)

    @torch.no_grad()
    def __call__(self, samples: EvalSamples) -> float:
        if samples.reference is None or samples.reference.shape[0] < 2:
            raise FlowpostError(f"{self.name} needs at least 2 held-out real images", where="evaluate.dataset")
        return frechet_distance(self.judge.features(samples.images), self.judge.features(samples.reference))
