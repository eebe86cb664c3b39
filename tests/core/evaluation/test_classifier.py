from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn import functional as F

from flowpost.errors import FlowpostError
from flowpost_digits.classifier import (
    JUDGE_CLASSIFIER,
    REWARD_CLASSIFIER,
    ClassifierSpec,
    DigitClassifier,
    accuracy,
    load_classifier,
    save_classifier,
    train_classifier,
)

Split = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@pytest.fixture(scope="module")
def digits() -> Split:
    data = load_digits()
    images = torch.tensor(data.images / 16.0, dtype=torch.float32)[:, None]
    images = F.interpolate(images, size=(16, 16), mode="bilinear", align_corners=False)
    labels = torch.tensor(data.target, dtype=torch.long)
    train, test = train_test_split(np.arange(len(labels)), test_size=0.2, random_state=0, stratify=data.target)
    return images[train], labels[train], images[test], labels[test]


@pytest.fixture(scope="module")
def trained(digits: Split) -> dict[str, DigitClassifier]:
    train_x, train_y, _, _ = digits
    return {
        spec.name: train_classifier(train_x, train_y, width=spec.width, seed=spec.seed)
        for spec in (REWARD_CLASSIFIER, JUDGE_CLASSIFIER)
    }


def test_presets_differ() -> None:
    assert REWARD_CLASSIFIER.width != JUDGE_CLASSIFIER.width
    assert REWARD_CLASSIFIER.seed != JUDGE_CLASSIFIER.seed
    assert REWARD_CLASSIFIER.name != JUDGE_CLASSIFIER.name


@pytest.mark.parametrize("spec", [REWARD_CLASSIFIER, JUDGE_CLASSIFIER], ids=lambda s: s.name)
def test_preset_reaches_held_out_accuracy(
    spec: ClassifierSpec, digits: Split, trained: dict[str, DigitClassifier]
) -> None:
    _, _, test_x, test_y = digits
    model = trained[spec.name]
    held_out = accuracy(model, test_x, test_y)
    print(f"{spec.name}: held-out accuracy {held_out:.4f}")
    assert not model.training
    assert model.width == spec.width
    assert held_out >= 0.97


def test_features_and_logits_shapes(trained: dict[str, DigitClassifier], digits: Split) -> None:
    model = trained[REWARD_CLASSIFIER.name]
    batch = digits[2][:5]
    with torch.no_grad():
        assert model.features(batch).shape == (5, model.feature_dim)
        assert model(batch).shape == (5, 10)


def test_training_is_deterministic_and_keeps_global_rng(digits: Split) -> None:
    train_x, train_y, _, _ = digits
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = train_classifier(train_x[:256], train_y[:256], width=8, seed=3, epochs=2)
    assert torch.equal(torch.rand(3), expected_next)
    second = train_classifier(train_x[:256], train_y[:256], width=8, seed=3, epochs=2)
    other = train_classifier(train_x[:256], train_y[:256], width=8, seed=4, epochs=2)
    first_state, second_state = first.state_dict(), second.state_dict()
    assert first_state.keys() == second_state.keys()
    assert all(torch.equal(first_state[key], second_state[key]) for key in first_state)
    assert not torch.equal(first_state["head.weight"], other.state_dict()["head.weight"])


def test_save_load_round_trip(tmp_path: Path, trained: dict[str, DigitClassifier], digits: Split) -> None:
    model = trained[JUDGE_CLASSIFIER.name]
    save_classifier(model, tmp_path, JUDGE_CLASSIFIER.name)
    assert (tmp_path / "digits-judge.safetensors").is_file()
    assert (tmp_path / "digits-judge.json").is_file()
    loaded = load_classifier(tmp_path, JUDGE_CLASSIFIER.name)
    assert not loaded.training
    assert (loaded.width, loaded.feature_dim, loaded.image_size) == (
        model.width,
        model.feature_dim,
        model.image_size,
    )
    batch = digits[2][:32]
    with torch.no_grad():
        assert torch.equal(loaded(batch), model(batch))


def test_corrupted_weights_raise(tmp_path: Path, trained: dict[str, DigitClassifier]) -> None:
    save_classifier(trained[REWARD_CLASSIFIER.name], tmp_path, "reward")
    weights = tmp_path / "reward.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(FlowpostError, match="re-run data acquisition") as info:
        load_classifier(tmp_path, "reward")
    assert info.value.where == str(weights)


def test_missing_files_raise(tmp_path: Path, trained: dict[str, DigitClassifier]) -> None:
    with pytest.raises(FlowpostError, match="re-run data acquisition"):
        load_classifier(tmp_path, "absent")
    save_classifier(trained[REWARD_CLASSIFIER.name], tmp_path, "reward")
    (tmp_path / "reward.safetensors").unlink()
    with pytest.raises(FlowpostError, match="missing") as info:
        load_classifier(tmp_path, "reward")
    assert info.value.where == str(tmp_path / "reward.safetensors")
