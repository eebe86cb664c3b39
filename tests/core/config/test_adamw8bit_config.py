"""``adamw8bit`` is chosen by ``train.optimizer`` or ``optimizers.<role>.name``, and refused at load where it
cannot run or resume."""

from __future__ import annotations

from typing import Any

import pytest

import flowpost.core.trainers.eight_bit as eight_bit
from flowpost.core.config.loading import pipeline_to_dict, validate_pipeline
from flowpost.errors import FlowpostError


def _error(config: dict[str, Any]) -> str:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(config)
    return str(info.value)


def _launched(config: dict[str, Any], backend: str, processes: int) -> dict[str, Any]:
    config["stages"]["sft"]["launch"] = {"backend": backend, "num_processes": processes}
    return config


def test_train_optimizer_adamw8bit_loads_and_is_dumped_only_when_chosen(tiny_pipeline) -> None:
    chosen = validate_pipeline(tiny_pipeline(optimizer="adamw8bit"))
    assert chosen.stages["sft"].arguments().optimizer == "adamw8bit"
    assert pipeline_to_dict(chosen)["stages"]["sft"]["train"]["optimizer"] == "adamw8bit"
    assert "optimizer" not in pipeline_to_dict(validate_pipeline(tiny_pipeline()))["stages"]["sft"]["train"]


def test_an_unknown_optimizer_name_is_refused_with_the_choices(tiny_pipeline) -> None:
    message = _error(tiny_pipeline(optimizer="adam8"))
    assert "stages.sft.train.optimizer" in message and "'adamw8bit'" in message


@pytest.mark.parametrize(
    ("backend", "reason"),
    [("deepspeed-zero2", "DeepSpeed ZeRO-2 steps an optimizer of its own"), ("fsdp2", "FSDP2 cannot load")],
)
def test_adamw8bit_over_sharding_layouts_is_refused_naming_the_key(tiny_pipeline, backend: str, reason: str) -> None:
    message = _error(_launched(tiny_pipeline(optimizer="adamw8bit"), backend, 2))
    assert f"stages.sft.train.optimizer: adamw8bit runs on launch.backend ddp only ({reason}" in message


def test_adamw8bit_over_ddp_or_one_process_of_any_backend_loads(tiny_pipeline) -> None:
    validate_pipeline(_launched(tiny_pipeline(optimizer="adamw8bit"), "ddp", 2))
    validate_pipeline(_launched(tiny_pipeline(optimizer="adamw8bit"), "fsdp2", 1))


def test_adamw8bit_without_torchao_is_refused_with_the_install_command(
    tiny_pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eight_bit, "torchao_installed", lambda: False)
    message = _error(tiny_pipeline(optimizer="adamw8bit"))
    assert "stages.sft.train.optimizer: adamw8bit needs torchao, which is not installed" in message
    assert "pip install 'flowpost[torchao]'" in message


def _with_dmd2(tiny_pipeline, generator: dict[str, Any], **train: Any) -> dict[str, Any]:
    config = tiny_pipeline()
    config["stages"]["dmd2"] = {
        "trainer": "dmd2",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "sampling": {"dynamics": "ode", "steps": 4},
        "train": train,
        "optimizers": {"generator": generator, "fake_score": {"lr": 1e-5}},
        "launch": {"backend": "fsdp2", "num_processes": 2},
    }
    return config


def test_a_role_optimizer_names_adamw8bit_and_is_refused_over_fsdp2_at_its_key(tiny_pipeline) -> None:
    message = _error(_with_dmd2(tiny_pipeline, {"lr": 1e-5, "name": "adamw8bit"}))
    assert "stages.dmd2.optimizers.generator.name: adamw8bit runs on launch.backend ddp only" in message
    assert "stages.dmd2.optimizers.fake_score" not in message


def test_a_multi_role_stage_takes_adamw8bit_from_its_roles_not_train(tiny_pipeline) -> None:
    message = _error(_with_dmd2(tiny_pipeline, {"lr": 1e-5}, optimizer="adamw8bit"))
    assert "stages.dmd2.train.optimizer: trainer 'dmd2' has one optimizer per role; name it in " in message
    assert "stages.dmd2.optimizers.<role>.name" in message
