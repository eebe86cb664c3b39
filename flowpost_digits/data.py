"""The built-in digits source: scikit-learn's 8x8 digits, upsampled, with templated captions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from flowpost.data.records import Demonstration

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

TRAIN_TEMPLATES = (
    "a handwritten digit {word}",
    "the number {digit} written by hand",
    "a drawing of the digit {word}",
    "handwritten {digit}",
)
EVAL_TEMPLATES = (
    "an image of the handwritten number {word}",
    "a scanned digit {digit} in pen",
)


def caption(template: str, label: int) -> str:
    """Fill ``{word}`` and ``{digit}`` in ``template`` for digit ``label``."""
    return template.format(word=DIGIT_WORDS[label], digit=label)


@dataclass(frozen=True)
class DigitsSplit:
    """Images float32 [N, 1, S, S] in [0, 1] and int64 labels [N], train and test."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


def load_digits_split(*, image_size: int = 16, test_fraction: float = 0.2, split_seed: int = 0) -> DigitsSplit:
    """Load the digits, upsample to ``image_size`` and split them, stratified by label."""
    bunch = load_digits()
    images = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    if image_size != images.shape[-1]:
        images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    images_np = images.clamp_(0.0, 1.0).numpy().astype(np.float32)
    labels = bunch.target.astype(np.int64)
    train_x, test_x, train_y, test_y = train_test_split(
        images_np, labels, test_size=test_fraction, stratify=labels, random_state=split_seed
    )
    return DigitsSplit(
        train_images=np.ascontiguousarray(train_x),
        train_labels=np.ascontiguousarray(train_y),
        test_images=np.ascontiguousarray(test_x),
        test_labels=np.ascontiguousarray(test_y),
    )


def demonstrations(
    images: np.ndarray, labels: np.ndarray, templates: tuple[str, ...] | list[str], *, prefix: str
) -> list[Demonstration]:
    """One record per (image, template) pair, keyed ``{prefix}-{index:05d}-t{template}``."""
    records = []
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        for j, template in enumerate(templates):
            records.append(
                Demonstration(
                    key=f"{prefix}-{i:05d}-t{j}",
                    prompt=caption(template, int(label)),
                    image=image,
                    label=int(label),
                    metadata={"template": j, "index": i},
                )
            )
    return records
