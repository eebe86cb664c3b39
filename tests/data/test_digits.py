from __future__ import annotations

import numpy as np
import pytest

from flowpost.data.records import Demonstration
from flowpost_digits.data import (
    EVAL_TEMPLATES,
    TRAIN_TEMPLATES,
    caption,
    demonstrations,
    load_digits_split,
)


def test_split_is_deterministic_with_expected_shapes_and_range() -> None:
    a = load_digits_split(image_size=16)
    b = load_digits_split(image_size=16)
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.train_images.dtype == np.float32 and a.train_labels.dtype == np.int64
    assert a.train_images.shape[1:] == (1, 16, 16)
    assert len(a.train_images) + len(a.test_images) == 1797
    assert len(a.test_images) == pytest.approx(0.2 * 1797, abs=1)
    assert a.train_images.min() >= 0.0 and a.train_images.max() <= 1.0
    assert set(a.test_labels.tolist()) == set(range(10))


def test_split_seed_changes_split() -> None:
    a = load_digits_split(image_size=8, split_seed=0)
    b = load_digits_split(image_size=8, split_seed=1)
    assert a.train_images.shape == (len(a.train_labels), 1, 8, 8)
    assert not np.array_equal(a.train_labels, b.train_labels)


def test_templates_are_disjoint_and_captions_differ() -> None:
    assert not set(TRAIN_TEMPLATES) & set(EVAL_TEMPLATES)
    captions = [caption(t, 3) for t in TRAIN_TEMPLATES + EVAL_TEMPLATES]
    assert len(set(captions)) == len(captions)
    assert all("three" in c or "3" in c for c in captions)
    assert caption("{word}/{digit}", 7) == "seven/7"


def test_demonstrations_one_per_image_and_template() -> None:
    split = load_digits_split(image_size=8)
    records = demonstrations(split.test_images[:3], split.test_labels[:3], TRAIN_TEMPLATES, prefix="test")
    assert len(records) == 3 * len(TRAIN_TEMPLATES)
    first = records[1]
    assert first.key == "test-00000-t1"
    assert first.prompt == caption(TRAIN_TEMPLATES[1], int(split.test_labels[0]))
    assert first.metadata == {"template": 1, "index": 0}
    assert first.label == int(split.test_labels[0])


def test_record_keys_reject_dots() -> None:
    with pytest.raises(ValueError, match="dots"):
        Demonstration(key="a.b", prompt="p", image=np.zeros((1, 2, 2), np.float32))
