"""``digit_adherence``: the reward classifier's probability of the prompted digit (never the judge)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from flowpost.errors import FlowpostError
from flowpost_digits.classifier import REWARD_CLASSIFIER, load_classifier
from flowpost_digits.labels import digit_label


@torch.no_grad()
def label_probability(classifier: torch.nn.Module, images: Tensor, labels: Tensor) -> Tensor:
    """[B] softmax probability the classifier gives each image's label."""
    return classifier(images.float()).softmax(-1).gather(1, labels.view(-1, 1)).squeeze(1)


class DigitAdherence:
    """P(label | image) under the reward classifier; the label comes from ``metadata[i]["label"]``."""

    name = "digit_adherence"

    def __init__(self, assets_dir: str | Path) -> None:
        self.classifier = load_classifier(Path(assets_dir), REWARD_CLASSIFIER.name)

    @torch.no_grad()
    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        size = self.classifier.image_size
        if media.ndim != 4 or tuple(media.shape[1:]) != (1, size, size):
            raise FlowpostError(
                f"digit_adherence scores grayscale {size}x{size} images [B, 1, {size}, {size}], got "
                f"{tuple(media.shape)}; send single-channel images of the classifier's size",
                where="rewards",
            )
        labels = []
        for prompt, meta in zip(prompts, metadata, strict=True):
            found = meta.get("label") if isinstance(meta, dict) else None
            try:
                labels.append(digit_label(found))
            except ValueError as exc:
                raise FlowpostError(
                    f"digit_adherence needs a digit 0-9 as 'label' in every prompt's metadata; prompt {prompt!r}: "
                    f"{exc}; give it one in its prompt file (a 'label' field or column)",
                    where="rewards",
                ) from None
        return label_probability(self.classifier, media, torch.tensor(labels))
