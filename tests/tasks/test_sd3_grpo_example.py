"""``examples/sd3-grpo.yaml``, shrunk to the tiny random SD3 folder, runs end to end through ``PipelineRun``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tiny_sd3_pipeline import CORPUS, T5_LENGTH

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.runner import PipelineRun

EXAMPLE = Path(__file__).parents[2] / "examples" / "sd3-grpo.yaml"
TINY_TRAIN = {
    "iterations": 1,
    "prompts_per_iteration": 2,
    "group_size": 2,
    "rollout_batch_size": 4,
    "train_batch_size": 4,
}


@pytest.mark.slow  # about 30 s: the conditions node, a stage process, the pipeline export
def test_the_example_runs_on_a_tiny_sd3_folder(sd3_pipeline_dir: Path, tmp_path: Path, monkeypatch) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(CORPUS[:4]) + "\n")
    config["smoke"] = True
    config["datasets"]["prompts"]["path"] = str(prompts)
    config["conditions"]["sd3"].update(max_length=T5_LENGTH)
    config["conditions"]["sd3"]["model"]["pretrained"] = str(sd3_pipeline_dir)
    stage = config["stages"]["grpo"]
    stage["model"].update(pretrained=str(sd3_pipeline_dir), torch_dtype="float32", lora={"rank": 4, "alpha": 8})
    stage["rewards"] = [{"name": "jpeg_incompressibility"}]  # PickScore needs its checkpoint
    stage["sampling"].update(steps=3, window=1)
    stage["train"].update(TINY_TRAIN, checkpoint_every=0)
    stage["launch"] = {"mixed_precision": "no"}
    run = PipelineRun(validate_pipeline(config), tmp_path / "ws")
    results = {node: run.execute(node) for node in run.nodes}
    assert results["train.grpo"].outputs["step"] == 1
    export = results["export"].path
    assert (export / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert (export / "model_index.json").is_file() and (export / "transformer").is_dir()
