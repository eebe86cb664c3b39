"""``examples/qwen-image-awm.yaml``, shrunk to the tiny random Qwen-Image folder, runs through ``PipelineRun``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pretrained_stage import TINY_ROLLOUTS, shrunk_example
from tiny_qwen_image_pipeline import MAX_LENGTH, RESOLUTION

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.qwen_image import QwenImageAdapter
from flowpost.tasks.runner import PipelineRun

EXAMPLE = Path(__file__).parents[2] / "examples" / "qwen-image-awm.yaml"
TINY_TRAIN = {**TINY_ROLLOUTS, "train_batch_size": 2, "gradient_accumulation_steps": 1, "train_timesteps": 2}


@pytest.mark.slow  # about 30 s: the conditions node, a stage process, the pipeline export
def test_the_example_runs_on_a_tiny_qwen_image_folder(qwen_image_pipeline_dir: Path, tmp_path: Path) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    shrunk_example(
        config,
        qwen_image_pipeline_dir,
        tmp_path,
        conditions="qwen",
        stage="awm",
        max_length=MAX_LENGTH,
        options={"resolution": RESOLUTION},
    )
    stage = config["stages"]["awm"]
    stage["sampling"].update(steps=4)
    stage["train"].update(TINY_TRAIN, checkpoint_every=0)
    run = PipelineRun(validate_pipeline(config), tmp_path / "ws")
    results = {node: run.execute(node) for node in run.nodes}
    assert results["train.awm"].outputs["iteration"] >= 1
    export = results["export"].path
    assert QwenImageAdapter.from_pretrained(export).resolution == RESOLUTION
    assert (export / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert (export / "model_index.json").is_file() and (export / "transformer").is_dir()
