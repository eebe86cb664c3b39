"""Values YAML allows and a pipeline must not: non-finite numbers and keys given twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowpost.core.config.loading import load_pipeline, read_yaml
from flowpost.errors import FlowpostError


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("stages.sft.train.lr=.inf", "stages.sft.train.lr: inf is not a finite number; give a finite value"),
        ("stages.sft.train.lr=-.inf", "stages.sft.train.lr: -inf is not a finite number; give a finite value"),
        ("stages.grpo.train.kl_beta=.nan", "stages.grpo.train.kl_beta: nan is not a finite number"),
        ("stages.grpo.sampling.noise_level=.NaN", "stages.grpo.sampling.noise_level: nan is not a finite number"),
        (
            "stages.grpo.rewards=[{name: digit_adherence, options: {scale: [1, .inf]}}]",
            "stages.grpo.rewards.0.options: scale.1 is not a finite number; give a finite value",
        ),
    ],
)
def test_non_finite_numbers_are_rejected_naming_the_dotted_path(override: str, line: str) -> None:
    with pytest.raises(FlowpostError) as info:
        load_pipeline(None, [override])
    assert f"invalid configuration:\n  {line}" in str(info.value)


def test_a_key_given_twice_names_the_file_and_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text("name: twice\nstages:\n  sft:\n    train:\n      lr: 1.0e-4\n      steps: 8\n      lr: 3.0e-4\n")
    with pytest.raises(FlowpostError) as info:
        read_yaml(path)
    assert str(info.value) == f"{path}:7: invalid YAML: duplicate key 'lr' (first at line 5); keep one of them"


def test_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text("base: &base {lr: 1, steps: 2}\nstage:\n  <<: *base\n  lr: 3\n")
    assert read_yaml(path)["stage"] == {"lr": 3, "steps": 2}
