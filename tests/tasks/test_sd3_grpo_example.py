"""``examples/sd3-grpo.yaml``, shrunk to the tiny random SD3 folder, runs end to end through ``PipelineRun``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pretrained_stage import TINY_ROLLOUTS, shrunk_example
from tiny_sd3_pipeline import T5_LENGTH

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.runner import PipelineRun

EXAMPLE = Path(__file__).parents[2] / "examples" / "sd3-grpo.yaml"
TINY_TRAIN = {**TINY_ROLLOUTS, "train_batch_size": 4, "gradient_accumulation_steps": 1}
TINY_SIDE = 16  # pixels: the tiny transformer's stock side (8 x 8 latents), in place of the example's 512


@pytest.mark.slow  # about 30 s: the conditions node, a stage process, the pipeline export
def test_the_example_runs_on_a_tiny_sd3_folder(sd3_pipeline_dir: Path, tmp_path: Path, monkeypatch) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    options = {"resolution": TINY_SIDE}
    shrunk_example(
        config, sd3_pipeline_dir, tmp_path, conditions="sd3", stage="grpo", max_length=T5_LENGTH, options=options
    )
    stage = config["stages"]["grpo"]
    stage["sampling"].update(steps=3, window=1)
    stage["train"].update(TINY_TRAIN, checkpoint_every=0)
    run = PipelineRun(validate_pipeline(config), tmp_path / "ws")
    results = {node: run.execute(node) for node in run.nodes}
    assert results["train.grpo"].outputs["iteration"] == 1
    export = results["export"].path
    assert (export / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert (export / "model_index.json").is_file() and (export / "transformer").is_dir()
