"""``examples/flux1-nft.yaml``, shrunk to the tiny random FLUX.1-dev folder, runs end to end through ``PipelineRun``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pretrained_stage import TINY_ROLLOUTS, shrunk_example
from tiny_flux1_pipeline import RESOLUTION
from tiny_sd3_pipeline import T5_LENGTH

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.flux1 import Flux1Adapter
from flowpost.tasks.preflight import stage_memory
from flowpost.tasks.runner import PipelineRun

EXAMPLE = Path(__file__).parents[2] / "examples" / "flux1-nft.yaml"
TINY_TRAIN = {**TINY_ROLLOUTS, "train_batch_size": 2, "gradient_accumulation_steps": 1}


@pytest.mark.slow  # about a minute: the conditions node, a stage process, the pipeline export
def test_the_example_runs_on_a_tiny_flux1_folder(flux1_pipeline_dir: Path, tmp_path: Path) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    options = {"resolution": RESOLUTION}
    shrunk_example(
        config, flux1_pipeline_dir, tmp_path, conditions="flux", stage="nft", max_length=T5_LENGTH, options=options
    )
    stage = config["stages"]["nft"]
    stage["sampling"].update(steps=3)
    stage["train"].update(TINY_TRAIN, checkpoint_every=0)
    pipeline = validate_pipeline(config)
    [memory] = stage_memory(pipeline)
    assert memory.fine_tune == "LoRA r4" and memory.estimate is not None
    run = PipelineRun(pipeline, tmp_path / "ws")
    results = {node: run.execute(node) for node in run.nodes}
    assert results["train.nft"].outputs["iteration"] >= 1
    export = results["export"].path
    assert Flux1Adapter.from_pretrained(export).resolution == RESOLUTION
    assert (export / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert (export / "model_index.json").is_file() and (export / "transformer").is_dir()
