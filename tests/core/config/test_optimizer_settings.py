"""A stage's ``train:`` and each ``optimizers.<role>`` entry share one set of optimizer settings and names."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.trainers.optimizers import build_role_optimizer
from flowpost.errors import FlowpostError


def _with_dmd2(tiny_pipeline, generator: dict[str, Any], **train: Any) -> dict[str, Any]:
    config = tiny_pipeline()
    config["stages"]["dmd2"] = {
        "trainer": "dmd2",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "sampling": {"dynamics": "ode", "steps": 4},
        "train": train,
        "optimizers": {"generator": generator, "fake_score": {"lr": 1e-5}},
    }
    return config


def _error(config: dict[str, Any]) -> str:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(config)
    return str(info.value)


def test_a_role_optimizer_steps_with_the_adam_betas_it_is_given(tiny_pipeline) -> None:
    pipeline = validate_pipeline(_with_dmd2(tiny_pipeline, {"lr": 1e-5, "adam_betas": [0.8, 0.9]}))
    config = pipeline.stages["dmd2"].optimizers["generator"]
    role = build_role_optimizer("generator", [("weight", torch.nn.Parameter(torch.zeros(2, 2)))], config, stage="dmd2")
    assert config.adam_betas == (0.8, 0.9) and role.optimizer[0].defaults["betas"] == (0.8, 0.9)


def test_betas_in_a_role_optimizer_says_its_name_is_adam_betas(tiny_pipeline) -> None:
    message = _error(_with_dmd2(tiny_pipeline, {"lr": 1e-5, "betas": [0.8, 0.9]}))
    assert "stages.dmd2.optimizers.generator: betas is called adam_betas (as in train:)" in message


def test_betas_in_train_says_its_name_is_adam_betas(tiny_pipeline) -> None:
    config = tiny_pipeline(betas=[0.8, 0.9])
    assert "stages.sft.train: betas is called adam_betas (as in train:); rename the key" in _error(config)


def test_a_multi_role_stage_takes_its_adam_betas_from_its_roles(tiny_pipeline) -> None:
    message = _error(_with_dmd2(tiny_pipeline, {"lr": 1e-5}, adam_betas=[0.8, 0.9]))
    assert "stages.dmd2.train.adam_betas: trainer 'dmd2' has one optimizer per role; set it in stages.dmd2." in message
