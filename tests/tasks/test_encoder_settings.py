"""The encoder length of a stage's condition cache travels into the model it trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.config.schema import StageConfig
from flowpost.core.io import write_json_atomic
from flowpost.core.models import text_encoders
from flowpost.core.models.registry import load_adapter
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.errors import FlowpostError
from flowpost.stage import build_adapter
from flowpost.tasks.train import stage_spec

SMALL = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}


def _conditions_dir(tmp_path: Path, max_length: int, encoder: str = "minilm") -> Path:
    folder = tmp_path / "conditions"
    write_json_atomic(
        folder / "encoder.json",
        {"encoder": encoder, "encoder_fingerprint": "abc", "max_length": max_length},
    )
    return folder


def test_stage_spec_records_the_cache_encoder_and_build_adapter_applies_it(tmp_path: Path, tiny_pipeline) -> None:
    pipeline = validate_pipeline(tiny_pipeline())
    spec = stage_spec(
        pipeline,
        "sft",
        tmp_path / "out",
        dataset_dir=None,
        conditions_dir=_conditions_dir(tmp_path, 24),
        encoder_fingerprint="abc",
        init_from=None,
    )
    assert spec.extra["encoder"] == {"name": "minilm", "fingerprint": "abc", "max_length": 24}
    adapter = build_adapter(StageConfig.model_validate(spec.config), spec)
    assert adapter.encoder_max_length == 24
    adapter.save_pretrained(tmp_path / "model")
    reloaded = load_adapter(tmp_path / "model")
    assert reloaded.encoder_max_length == 24 and reloaded.describe()["encoder_max_length"] == 24


@pytest.mark.parametrize(
    ("encoder", "reads"),
    [("flowpost_digits.encoder:MiniLMEncoder", True), ("flowpost_example_plugin.rewards:Contrast", False)],
)
def test_a_cache_whose_encoder_is_named_by_class_path_is_read_when_it_is_the_model_s_class(
    tmp_path: Path, tiny_pipeline, encoder: str, reads: bool
) -> None:
    pipeline = validate_pipeline(tiny_pipeline())
    conditions = _conditions_dir(tmp_path, 16, encoder)
    spec = stage_spec(
        pipeline,
        "sft",
        tmp_path / "out",
        dataset_dir=None,
        conditions_dir=conditions,
        encoder_fingerprint="abc",
        init_from=None,
    )
    if reads:
        assert build_adapter(StageConfig.model_validate(spec.config), spec).encoder_name == "minilm"
        return
    with pytest.raises(FlowpostError, match="stages.sft.data.conditions: the model .* reads 'minilm' conditions"):
        build_adapter(StageConfig.model_validate(spec.config), spec)


def test_a_manifest_without_the_length_loads_with_the_default(tmp_path: Path) -> None:
    adapter = TinySD3Adapter.from_scratch(seed=0, overrides=SMALL)
    adapter.save_pretrained(tmp_path)
    meta = json.loads((tmp_path / "flowpost_adapter.json").read_text())
    del meta["encoder_max_length"]
    write_json_atomic(tmp_path / "flowpost_adapter.json", meta)
    assert TinySD3Adapter.from_pretrained(tmp_path).encoder_max_length == 16


def test_encode_conditions_defaults_to_the_adapter_length(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths: list[int] = []

    class Recorder:
        def encode(self, prompts: list[str]) -> None:
            return None

    def fake_build(name: str, *, max_length: int) -> Recorder:
        lengths.append(max_length)
        return Recorder()

    monkeypatch.setattr(text_encoders, "build_encoder", fake_build)
    adapter = TinySD3Adapter.from_scratch(seed=0, overrides=SMALL)
    adapter.encoder_max_length = 32
    adapter.encode_conditions(["a"])
    adapter.encode_conditions(["a"], max_length=8)
    assert lengths == [32, 8]
