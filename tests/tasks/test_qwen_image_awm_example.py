"""``examples/qwen-image-awm.yaml``, shrunk to the tiny random Qwen-Image folder, runs through ``PipelineRun``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tiny_qwen_image_pipeline import MAX_LENGTH, RESOLUTION
from tiny_sd3_pipeline import CORPUS

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.qwen_image import QwenImageAdapter
from flowpost.tasks.runner import PipelineRun

EXAMPLE = Path(__file__).parents[2] / "examples" / "qwen-image-awm.yaml"
TINY_TRAIN = {
    "iterations": 1,
    "prompts_per_iteration": 2,
    "group_size": 2,
    "rollout_batch_size": 4,
    "train_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "train_timesteps": 2,
}


@pytest.mark.slow  # about 30 s: the conditions node, a stage process, the pipeline export
def test_the_example_runs_on_a_tiny_qwen_image_folder(qwen_image_pipeline_dir: Path, tmp_path: Path) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(CORPUS[:4]) + "\n")
    config["smoke"] = True
    config["datasets"]["prompts"]["path"] = str(prompts)
    config["conditions"]["qwen"].update(max_length=MAX_LENGTH)
    config["conditions"]["qwen"]["model"]["pretrained"] = str(qwen_image_pipeline_dir)
    stage = config["stages"]["awm"]
    model = {"pretrained": str(qwen_image_pipeline_dir), "torch_dtype": "float32"}
    stage["model"].update(
        model, lora={"rank": 4, "alpha": 8}, options={**stage["model"]["options"], "resolution": RESOLUTION}
    )
    stage["rewards"] = [{"name": "jpeg_incompressibility"}]  # PickScore needs its checkpoint
    stage["sampling"].update(steps=4)
    stage["train"].update(TINY_TRAIN, checkpoint_every=0)
    stage["launch"] = {"mixed_precision": "no"}
    run = PipelineRun(validate_pipeline(config), tmp_path / "ws")
    results = {node: run.execute(node) for node in run.nodes}
    assert results["train.awm"].outputs["step"] >= 1
    export = results["export"].path
    assert QwenImageAdapter.from_pretrained(export).resolution == RESOLUTION
    assert (export / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert (export / "model_index.json").is_file() and (export / "transformer").is_dir()
