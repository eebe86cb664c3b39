"""The wan2 family in a pipeline: its conditions node, ``model.options`` and ``examples/wan2-grpo.yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pretrained_stage import TINY_ROLLOUTS, shrunk_example, with_model
from tiny_sd3_pipeline import T5_LENGTH
from tiny_wan2_pipeline import FRAMES, HEIGHT, WIDTH, load_wan2_adapter

from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.config.loading import validate_pipeline
from flowpost.core.config.schema import ConditionsConfig
from flowpost.core.models.wan2 import Wan2Adapter
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.condition_cache import load_conditions
from flowpost.errors import FlowpostError
from flowpost.stage import build_adapter
from flowpost.tasks.conditions import cache_conditions
from flowpost.tasks.runner import PipelineRun

PROMPTS = ["a red cat", "a blue dog on a car"]
EXAMPLE = Path(__file__).parents[2] / "examples" / "wan2-grpo.yaml"
TINY_VIDEO = {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES, "fps": 8}


def test_the_cache_holds_wan2s_token_states_and_masks(wan2_pipeline_dir: Path, tmp_path: Path) -> None:
    config = ConditionsConfig.model_validate(
        {"model": {"family": "wan2", "pretrained": str(wan2_pipeline_dir)}, "datasets": ["x"], "max_length": T5_LENGTH}
    )
    summary = cache_conditions(config, [], tmp_path, extra_prompts=PROMPTS)
    assert (summary["encoder"], summary["total"]) == ("wan2", 3)
    expected = load_wan2_adapter(wan2_pipeline_dir).encode_conditions([NULL_PROMPT, *PROMPTS])
    loaded = load_conditions(tmp_path, [NULL_PROMPT, *PROMPTS], encoder_fingerprint=summary["encoder_fingerprint"])
    assert torch.equal(loaded.token_states, expected.token_states) and loaded.pooled.shape == (3, 0)
    assert torch.equal(loaded.token_mask, expected.token_mask.long())
    assert int(loaded.token_mask[0].sum()) < int(loaded.token_mask[2].sum()) <= T5_LENGTH  # "" is the shortest


def _stage(tiny_pipeline, folder: Path, options: dict[str, Any]) -> Any:
    return validate_pipeline(
        with_model(tiny_pipeline, {"family": "wan2", "pretrained": str(folder), "options": options})
    ).stages["sft"]


def _build(stage: Any, tmp_path: Path) -> Any:
    return build_adapter(stage, StageSpec(stage="sft", seed=0, config={}, output_dir=str(tmp_path)))


def test_a_stage_builds_wan2_at_its_video_options(tiny_pipeline, wan2_pipeline_dir: Path, tmp_path: Path) -> None:
    options = {**TINY_VIDEO, "gradient_checkpointing": True}
    stage = _stage(tiny_pipeline, wan2_pipeline_dir, options)
    assert stage.model.model_dump()["options"] == options
    adapter = _build(stage, tmp_path)
    assert isinstance(adapter, Wan2Adapter) and adapter.latent_shape == (4, 2, 4, 8) and adapter.fps == 8
    assert adapter.module().is_gradient_checkpointing and adapter.describe()["gradient_checkpointing"] is True


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"resolution": 512}, r"stages\.sft\.model\.options: family 'wan2' has no option resolution; accepted: height"),
        ({**TINY_VIDEO, "num_frames": 8}, r"stages\.sft\.model\.options\.num_frames: num_frames 8 is not 4 k \+ 1"),
    ],
)
def test_a_bad_video_option_names_its_config_path(tiny_pipeline, wan2_pipeline_dir, tmp_path, options, message):
    with pytest.raises(FlowpostError, match=message):
        _build(_stage(tiny_pipeline, wan2_pipeline_dir, options), tmp_path)


def test_options_without_pretrained_are_refused(tiny_pipeline) -> None:
    config = tiny_pipeline()
    config["stages"]["sft"]["model"]["options"] = {"height": 16}
    with pytest.raises(FlowpostError, match=r"stages\.sft\.model.*options apply only with pretrained"):
        validate_pipeline(config)


@pytest.mark.slow  # about 60 s: the conditions node, a stage process, the pipeline export, an mp4 sample
def test_the_example_runs_on_a_tiny_wan_folder(wan2_pipeline_dir: Path, tmp_path: Path) -> None:
    from flowpost.core.sampling.generate import sample_prompts

    config = yaml.safe_load(EXAMPLE.read_text())
    sampled = [{"name": "jpeg_incompressibility", "frames": "sampled", "sampled_frames": 2}]
    shrunk_example(
        config,
        wan2_pipeline_dir,
        tmp_path,
        conditions="wan2",
        stage="grpo",
        max_length=T5_LENGTH,
        options=TINY_VIDEO,
        rewards=sampled,
    )
    stage = config["stages"]["grpo"]
    stage["sampling"].update(steps=3, window=1)
    stage["train"].update(TINY_ROLLOUTS, train_batch_size=4, checkpoint_every=0)
    run = PipelineRun(validate_pipeline(config), tmp_path / "ws")
    results = {node: run.execute(node) for node in run.nodes}
    assert results["train.grpo"].outputs["iteration"] == 1
    export = results["export"].path
    assert (export / "lora" / "pytorch_lora_weights.safetensors").is_file() and (export / "model_index.json").is_file()
    videos, path = sample_prompts(export, ["a red cat"], out=tmp_path / "cat.mp4", steps=2, guidance=5.0)
    assert videos.shape == (1, 3, FRAMES, HEIGHT, WIDTH) and path.stat().st_size > 0
