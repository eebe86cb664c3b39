"""``conditions.<name>.model``: a family's own text encoders fill the cache; stages of another family are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from pretrained_stage import RGB_FOLDER
from tiny_flux1_pipeline import load_flux1_adapter
from tiny_flux2_pipeline import DEV_MAX_LENGTH, KLEIN_MAX_LENGTH, load_flux2_adapter, load_flux2_klein_adapter
from tiny_qwen_image_pipeline import load_qwen_image_adapter
from tiny_sd3_pipeline import T5_LENGTH, load_sd3_adapter
from tiny_z_image_pipeline import load_z_image_adapter

from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.config.loading import validate_pipeline
from flowpost.core.config.schema import ConditionsConfig
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.condition_cache import load_condition_table, load_conditions
from flowpost.errors import FlowpostError
from flowpost.stage import build_adapter
from flowpost.tasks.conditions import cache_conditions, encoder_settings
from flowpost.tasks.runner import PRETRAINED, PipelineRun

PROMPTS = ["a red cat", "a blue dog on a car"]
LENGTHS = {"flux2": DEV_MAX_LENGTH, "flux2-klein": KLEIN_MAX_LENGTH}  # padded to: the prompts must fit


def _config(folder: Path, family: str = "sd3") -> ConditionsConfig:
    length = LENGTHS.get(family, T5_LENGTH)
    return ConditionsConfig.model_validate(
        {"model": {"family": family, "pretrained": str(folder)}, "datasets": ["x"], "max_length": length}
    )


def test_the_cache_holds_the_familys_encode_conditions_exactly(sd3_pipeline_dir: Path, tmp_path: Path) -> None:
    summary = cache_conditions(_config(sd3_pipeline_dir), [], tmp_path, extra_prompts=PROMPTS)
    assert (summary["encoder"], summary["pretrained"], summary["total"]) == ("sd3", str(sd3_pipeline_dir), 3)
    expected = load_sd3_adapter(sd3_pipeline_dir).encode_conditions([NULL_PROMPT, *PROMPTS])
    loaded = load_conditions(tmp_path, [NULL_PROMPT, *PROMPTS], encoder_fingerprint=summary["encoder_fingerprint"])
    assert torch.equal(loaded.token_states, expected.token_states) and torch.equal(loaded.pooled, expected.pooled)
    assert torch.equal(loaded.token_mask, expected.token_mask.long())
    assert encoder_settings(tmp_path)["pretrained"] == str(sd3_pipeline_dir)
    again = cache_conditions(_config(sd3_pipeline_dir), [], tmp_path, extra_prompts=PROMPTS)
    assert (again["hits"], again["misses"]) == (3, 0)  # the null prompt too: each encoded once


@pytest.mark.parametrize(
    ("family", "loader", "folder"),
    [
        ("flux1", load_flux1_adapter, "flux1_pipeline_dir"),
        ("qwen-image", load_qwen_image_adapter, "qwen_image_pipeline_dir"),
        ("z-image", load_z_image_adapter, "z_image_pipeline_dir"),
        ("flux2", load_flux2_adapter, "flux2_pipeline_dir"),
        ("flux2-klein", load_flux2_klein_adapter, "flux2_klein_pipeline_dir"),
    ],
)
def test_a_familys_cache_holds_its_encode_conditions(request, tmp_path: Path, family, loader, folder) -> None:
    folder = request.getfixturevalue(folder)
    summary = cache_conditions(_config(folder, family), [], tmp_path, extra_prompts=PROMPTS)
    assert (summary["encoder"], summary["pretrained"], summary["total"]) == (family, str(folder), 3)
    expected = loader(folder).encode_conditions([NULL_PROMPT, *PROMPTS])
    loaded = load_conditions(tmp_path, [NULL_PROMPT, *PROMPTS], encoder_fingerprint=summary["encoder_fingerprint"])
    assert torch.equal(loaded.token_states, expected.token_states) and torch.equal(loaded.pooled, expected.pooled)
    assert torch.equal(loaded.token_mask, expected.token_mask.long())


def test_qwen_image_rows_keep_their_own_lengths_across_encodes(qwen_image_pipeline_dir: Path, tmp_path: Path) -> None:
    """Rows of different lengths, encoded by separate runs, read back as one batch padded and masked to the longest."""
    config = _config(qwen_image_pipeline_dir, "qwen-image")
    first = cache_conditions(config, [], tmp_path, extra_prompts=PROMPTS[:1])
    cache_conditions(config, [], tmp_path, extra_prompts=PROMPTS)
    loaded = load_conditions(tmp_path, PROMPTS, encoder_fingerprint=first["encoder_fingerprint"])
    alone = [load_qwen_image_adapter(qwen_image_pipeline_dir).encode_conditions([p]) for p in PROMPTS]
    assert loaded.pooled.shape == (2, 0)
    for row, batch in enumerate(alone):
        length = batch.token_states.shape[1]
        assert int(loaded.token_mask[row].sum()) == length
        assert torch.equal(loaded.token_states[row, :length], batch.token_states[0])


def test_a_cache_of_variable_lengths_round_trips_with_its_shapes(sd3_pipeline_dir: Path, tmp_path: Path) -> None:
    short = cache_conditions(_config(sd3_pipeline_dir), [], tmp_path, extra_prompts=PROMPTS)
    longer = _config(sd3_pipeline_dir).model_copy(update={"max_length": 24})
    long = cache_conditions(longer, [], tmp_path, extra_prompts=PROMPTS)
    assert short["encoder_fingerprint"] != long["encoder_fingerprint"]
    for summary, width in ((short, 16 + T5_LENGTH), (long, 16 + 24)):
        _, batch = load_condition_table(tmp_path, summary["encoder_fingerprint"])
        assert batch.token_states.shape[1] == width and bool((batch.token_mask == 1).all())


def test_the_pipeline_folder_enters_the_conditions_fingerprint(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    folder = tmp_path / "weights"
    shutil.copytree(sd3_pipeline_dir, folder)
    config = _sd3_pipeline(tiny_pipeline, folder)
    first = PipelineRun(validate_pipeline(config), tmp_path / "ws").inputs["conditions.sd3"]
    assert PRETRAINED in first["sources"]
    encoder = folder / "text_encoder_3" / "config.json"
    encoder.write_text(json.dumps({**json.loads(encoder.read_text()), "dropout_rate": 0.2}))
    again = PipelineRun(validate_pipeline(config), tmp_path / "ws").inputs["conditions.sd3"]
    assert again["sources"][PRETRAINED] != first["sources"][PRETRAINED]


def _sd3_pipeline(tiny_pipeline, folder: Path, *, stage_family: str = "sd3") -> dict[str, Any]:
    """The tiny pipeline's SFT stage on the RGB shapes folder, through a cache of ``folder``'s SD3 encoders."""
    config = tiny_pipeline()
    config["datasets"]["shapes"] = {"source": "image-folder", "path": str(RGB_FOLDER), "preprocess": {"mode": "rgb"}}
    config["conditions"]["sd3"] = {"model": {"family": "sd3", "pretrained": str(folder)}, "datasets": ["shapes"]}
    model = {"family": stage_family, "pretrained": str(folder)} if stage_family == "sd3" else {"family": stage_family}
    config["stages"]["sft"]["model"] = model
    config["stages"]["sft"]["data"] = {"dataset": "shapes", "conditions": "sd3"}
    return config


def test_the_minilm_form_is_unchanged_and_excludes_a_model() -> None:
    assert ConditionsConfig.model_validate({"datasets": ["d"]}).model_dump() == {
        "encoder": "minilm",
        "datasets": ["d"],
        "max_length": 16,
    }
    with pytest.raises(ValueError, match="encoder and model are alternatives"):
        ConditionsConfig.model_validate(
            {"encoder": "minilm", "model": {"family": "sd3", "pretrained": "p"}, "datasets": ["d"]}
        )


@pytest.mark.parametrize(
    ("family", "cache", "message"),
    [
        (
            "tiny-sd3",
            "sd3",
            r"stages\.sft\.model\.family: 'tiny-sd3' differs from 'sd3'.*conditions\.sd3\.model\.family",
        ),
        ("sd3", "minilm", r"stages\.sft\.model\.family: 'sd3' loads from model\.pretrained.*conditions\.minilm"),
    ],
)
def test_a_stage_of_another_family_than_its_cache_is_rejected(tiny_pipeline, family, cache, message) -> None:
    config = _sd3_pipeline(tiny_pipeline, Path("weights"), stage_family=family)
    config["stages"]["sft"]["data"]["conditions"] = cache
    with pytest.raises(FlowpostError, match=message):
        validate_pipeline(config)


def test_a_stage_refuses_a_cache_made_by_another_encoder(tiny_pipeline, sd3_pipeline_dir, tmp_path) -> None:
    stage = validate_pipeline(_sd3_pipeline(tiny_pipeline, sd3_pipeline_dir)).stages["sft"]
    encoder = {"name": "minilm", "fingerprint": "abc"}
    spec = StageSpec(
        stage="sft", seed=0, config={}, output_dir=str(tmp_path), conditions_dir="CACHE", extra={"encoder": encoder}
    )
    with pytest.raises(FlowpostError, match=rf"{sd3_pipeline_dir}.*'sd3'.*CACHE.*'minilm'"):
        build_adapter(stage, spec)
