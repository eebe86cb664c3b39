"""``builtin-digits``: shards of the digits under their caption templates, and the classifiers (``assets/``)
the adherence reward and the judge metrics read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flowpost.core.datasets import DatasetSource
from flowpost.core.io import write_json_atomic
from flowpost.core.logging import get_logger
from flowpost.data.shards import write_shards
from flowpost_digits.classifier import JUDGE_CLASSIFIER, REWARD_CLASSIFIER, accuracy, save_classifier, train_classifier
from flowpost_digits.config import DigitsDataset
from flowpost_digits.data import EVAL_TEMPLATES, TRAIN_TEMPLATES, caption, demonstrations, load_digits_split

log = get_logger(__name__)
MIN_ACCURACY = 0.97


class DigitsSource(DatasetSource):
    """Acquires a ``builtin-digits`` dataset."""

    model = DigitsDataset
    config: DigitsDataset

    def acquire(self, out_dir: Path, *, smoke: bool, where: str) -> dict[str, Any]:
        """Shards, classifiers and manifest (``acquire_digits``)."""
        return acquire_digits(self.config, out_dir, smoke=smoke)


def acquire_digits(config: DigitsDataset, out_dir: Path, *, smoke: bool = False) -> dict[str, Any]:
    """Write ``train/`` and ``test/`` shards, ``assets/`` classifiers and ``manifest.json``.

    Train records pair each train image with every training template; test records pair each
    held-out image with every held-out template (evaluation only).
    """
    split = load_digits_split(
        image_size=config.image_size,
        test_fraction=config.test_fraction,
        split_seed=config.split_seed,
    )
    shards = {
        "train": write_shards(
            demonstrations(split.train_images, split.train_labels, TRAIN_TEMPLATES, prefix="train"),
            out_dir / "train",
        ),
        "test": write_shards(
            demonstrations(split.test_images, split.test_labels, EVAL_TEMPLATES, prefix="test"),
            out_dir / "test",
        ),
    }
    for name, manifest in shards.items():
        write_json_atomic(out_dir / name / "manifest.json", manifest)

    train_x, train_y = torch.from_numpy(split.train_images), torch.from_numpy(split.train_labels)
    test_x, test_y = torch.from_numpy(split.test_images), torch.from_numpy(split.test_labels)
    assets = {}
    for spec in (REWARD_CLASSIFIER, JUDGE_CLASSIFIER):
        model = train_classifier(train_x, train_y, width=spec.width, seed=spec.seed, epochs=3 if smoke else 30)
        held_out = accuracy(model, test_x, test_y)
        if not smoke and held_out < MIN_ACCURACY:
            raise RuntimeError(f"classifier {spec.name} reached {held_out:.4f} < {MIN_ACCURACY} held-out accuracy")
        save_classifier(model, out_dir / "assets", spec.name)
        assets[spec.name] = {
            "role": "reward" if spec is REWARD_CLASSIFIER else "judge",
            "accuracy": held_out,
        }
        log.info("classifier %s: held-out accuracy %.4f", spec.name, held_out)

    manifest = {
        "source": config.source,
        "image_size": config.image_size,
        "counts": {name: m["count"] for name, m in shards.items()},
        "shards": {name: m["shards"] for name, m in shards.items()},
        "train_prompts": shards["train"]["prompts"],
        "eval_prompts": [
            {"prompt": caption(template, label), "label": label} for template in EVAL_TEMPLATES for label in range(10)
        ],
        "assets": assets,
        "smoke": smoke,
    }
    write_json_atomic(out_dir / "manifest.json", manifest)
    return manifest
