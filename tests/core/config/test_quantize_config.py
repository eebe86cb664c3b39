"""``model.quantize``: refused by validation where it cannot work, naming the path and the fix; part of the
stage's fingerprint when set, absent from it at its default."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from flowpost.core.config.loading import validate_pipeline
from flowpost.errors import FlowpostError
from flowpost.tasks.graph import build_nodes, fingerprints

WHERE = "stages.sft.model.quantize: int8"


def _quantized(tiny_pipeline, *, lora: dict[str, Any] | None = None, **launch: Any) -> dict[str, Any]:
    config = tiny_pipeline()
    config["stages"]["sft"]["model"].update(quantize="int8", lora=lora or {"rank": 4})
    config["stages"]["sft"]["launch"] = launch
    return config


def _refusal(config: dict[str, Any]) -> str:
    with pytest.raises(FlowpostError) as caught:
        validate_pipeline(config)
    return str(caught.value)


def test_a_lora_stage_over_a_quantized_base_validates(tiny_pipeline) -> None:
    assert validate_pipeline(_quantized(tiny_pipeline)).stages["sft"].model.quantize == "int8"


def test_a_fully_trained_transformer_is_refused(tiny_pipeline) -> None:
    config = _quantized(tiny_pipeline)
    config["stages"]["sft"]["model"]["lora"] = None
    message = _refusal(config)
    assert f"{WHERE} stores a frozen base under LoRA adapters" in message
    assert "set stages.sft.model.lora or quantize: none" in message


@pytest.mark.parametrize(("backend", "named"), [("fsdp2", "FSDP2"), ("deepspeed-zero2", "DeepSpeed")])
def test_a_sharded_layout_is_refused(tiny_pipeline, backend: str, named: str) -> None:
    message = _refusal(_quantized(tiny_pipeline, backend=backend))
    assert f"{WHERE} with launch.backend {backend}" in message and named in message
    assert "use launch.backend: ddp or quantize: none" in message


def test_more_than_one_process_is_refused(tiny_pipeline) -> None:
    message = _refusal(_quantized(tiny_pipeline, num_processes=2))
    assert f"{WHERE} with launch.num_processes 2" in message and "launch.num_processes: 1" in message


def test_without_torchao_it_says_how_to_install_it(tiny_pipeline, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao", None)  # what an environment without the package finds
    message = _refusal(_quantized(tiny_pipeline))
    assert f"{WHERE} needs torchao: pip install 'flowpost[torchao]'" in message


def test_an_unknown_kind_is_refused_with_the_accepted_ones(tiny_pipeline) -> None:
    config = _quantized(tiny_pipeline)
    config["stages"]["sft"]["model"]["quantize"] = "int4"
    message = _refusal(config)
    assert "stages.sft.model.quantize" in message and "'int8'" in message and "'fp8'" in message


def test_quantize_changes_the_stage_fingerprint_and_its_default_changes_none(tiny_pipeline) -> None:
    def prints(config: dict[str, Any]) -> dict[str, str]:
        return fingerprints(build_nodes(validate_pipeline(config)), code="code")

    config = tiny_pipeline()
    config["stages"]["sft"]["model"]["lora"] = {"rank": 4}
    lora = prints(config)
    config["stages"]["sft"]["model"]["quantize"] = "none"
    assert prints(config) == lora
    int8 = prints(_quantized(tiny_pipeline))
    fp8_config = _quantized(tiny_pipeline)
    fp8_config["stages"]["sft"]["model"]["quantize"] = "fp8"
    fp8 = prints(fp8_config)
    for node in ("train.sft", "eval.sft", "export"):
        assert len({lora[node], int8[node], fp8[node]}) == 3, node
    assert int8["conditions.minilm"] == lora["conditions.minilm"]
