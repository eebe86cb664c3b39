"""``model.pretrained``: the schema, the adapter a stage builds, and the weights' part in its fingerprint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pretrained_stage import sft_adapter, with_model

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.qwen_image import QwenImageAdapter
from flowpost.core.models.sd3 import SD3Adapter
from flowpost.errors import FlowpostError
from flowpost.tasks.runner import PRETRAINED, PipelineRun


def _train_inputs(config: dict[str, Any], workspace: Path) -> dict[str, Any]:
    return PipelineRun(validate_pipeline(config), workspace).inputs["train.sft"]


def test_without_pretrained_the_stage_config_and_sources_are_as_before(tiny_pipeline, tmp_path: Path) -> None:
    inputs = _train_inputs(tiny_pipeline(), tmp_path)
    assert set(inputs["config"]["model"]) == {"family", "init", "init_weights", "shift", "transformer", "lora"}
    assert "sources" not in inputs


def test_the_pipeline_folders_files_enter_the_train_fingerprint(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    folder = tmp_path / "weights"
    shutil.copytree(sd3_pipeline_dir, folder)
    config = with_model(tiny_pipeline, {"family": "sd3", "pretrained": str(folder), "torch_dtype": "float32"})
    first = _train_inputs(config, tmp_path / "ws")
    assert first["config"]["model"]["pretrained"] == str(folder) and PRETRAINED in first["sources"]
    assert _train_inputs(config, tmp_path / "ws") == first
    scheduler = folder / "scheduler" / "scheduler_config.json"
    scheduler.write_text(json.dumps({**json.loads(scheduler.read_text()), "shift": 2.0}))
    assert _train_inputs(config, tmp_path / "ws")["sources"][PRETRAINED] != first["sources"][PRETRAINED]


def test_a_component_folders_files_enter_the_train_fingerprint(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    transformer = tmp_path / "tuned"
    shutil.copytree(sd3_pipeline_dir / "transformer", transformer)
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "components": {"transformer": str(transformer)}}
    config = with_model(tiny_pipeline, model)
    first = _train_inputs(config, tmp_path / "ws")
    assert first["config"]["model"]["components"] == {"transformer": str(transformer)}
    plain = _train_inputs(with_model(tiny_pipeline, {**model, "components": None}), tmp_path / "ws")
    assert "components" not in plain["config"]["model"] and plain["sources"][PRETRAINED] != first["sources"][PRETRAINED]
    config_file = transformer / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "qk_norm": None}))
    assert _train_inputs(config, tmp_path / "ws")["sources"][PRETRAINED] != first["sources"][PRETRAINED]
    adapter = sft_adapter(config, tmp_path)  # without qk_norm: the replacing folder's own config
    assert isinstance(adapter, SD3Adapter) and adapter.source.components == {"transformer": str(transformer)}
    assert adapter.module().config.qk_norm is None


@pytest.mark.parametrize(
    ("option", "value"), [("revision", "main"), ("options", {"resolution": 512}), ("components", {"transformer": "t"})]
)
def test_pretrained_options_without_pretrained_are_rejected(tiny_pipeline, option: str, value: Any) -> None:
    with pytest.raises(FlowpostError, match=rf"stages\.sft\.model.*{option}"):
        validate_pipeline(with_model(tiny_pipeline, {"family": "sd3", option: value}))


def test_a_stage_builds_the_sd3_adapter_from_its_pipeline(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "lora": {"rank": 2}}
    adapter = sft_adapter(with_model(tiny_pipeline, model), tmp_path)
    assert isinstance(adapter, SD3Adapter) and adapter.lora is not None and adapter.shift == 3.0


def test_a_stage_builds_the_qwen_image_adapter_at_its_resolution(tiny_pipeline, qwen_image_pipeline_dir, tmp_path):
    model = {"family": "qwen-image", "pretrained": str(qwen_image_pipeline_dir), "options": {"resolution": 32}}
    config = with_model(tiny_pipeline, model)
    assert _train_inputs(config, tmp_path / "ws")["config"]["model"]["options"] == {"resolution": 32}
    adapter = sft_adapter(config, tmp_path)
    assert isinstance(adapter, QwenImageAdapter) and adapter.resolution == 32 and adapter.latent_shape == (64, 64)


def test_an_option_of_another_family_is_refused(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "options": {"distilled_guidance": 3.5}}
    message = r"stages\.sft\.model\.options: family 'sd3' has no option distilled_guidance; accepted: resolution"
    with pytest.raises(FlowpostError, match=message):
        sft_adapter(with_model(tiny_pipeline, model), tmp_path)


@pytest.mark.parametrize("resolution", [40, 0, "512"])
def test_a_bad_resolution_names_its_option_path(tiny_pipeline, qwen_image_pipeline_dir, tmp_path, resolution) -> None:
    model = {"family": "qwen-image", "pretrained": str(qwen_image_pipeline_dir), "options": {"resolution": resolution}}
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model\.options\.resolution: resolution .* multiple of 16"):
        sft_adapter(with_model(tiny_pipeline, model), tmp_path)


def test_a_family_without_pipelines_rejects_pretrained(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    with pytest.raises(FlowpostError, match="model.pretrained"):
        sft_adapter(with_model(tiny_pipeline, {"family": "tiny-sd3", "pretrained": str(sd3_pipeline_dir)}), tmp_path)
