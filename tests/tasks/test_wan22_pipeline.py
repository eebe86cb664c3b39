"""The wan22-a14b family in a pipeline: its conditions node, a stage process, the export and a sample."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pretrained_stage import TINY_ROLLOUTS, shrunk_example
from tiny_sd3_pipeline import T5_LENGTH
from tiny_wan2_pipeline import FRAMES, HEIGHT, WIDTH

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.runner import PipelineRun

EXAMPLE = Path(__file__).parents[2] / "examples" / "wan2-grpo.yaml"


@pytest.mark.slow  # about a minute: the conditions node, a stage process, the pipeline export, an mp4 sample
def test_the_wan2_example_runs_on_both_experts_of_a_tiny_folder(wan22_pipeline_dir: Path, tmp_path: Path) -> None:
    """The Wan2.1 GRPO example turned to the two-expert family: LoRA on both experts, the low-noise one guided at
    3, exported as the stock pipeline's two LoRA folders and a pipeline folder that samples alone."""
    from flowpost.core.sampling.generate import sample_prompts

    config = yaml.safe_load(EXAMPLE.read_text())
    config["conditions"]["wan2"]["model"]["family"] = "wan22-a14b"
    config["stages"]["grpo"]["model"]["family"] = "wan22-a14b"
    options = {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES, "fps": 8, "low_noise_guidance": 3.0}
    sampled = [{"name": "jpeg_incompressibility", "frames": "sampled", "sampled_frames": 2}]
    shrunk_example(
        config,
        wan22_pipeline_dir,
        tmp_path,
        conditions="wan2",
        stage="grpo",
        max_length=T5_LENGTH,
        options=options,
        rewards=sampled,
    )
    stage = config["stages"]["grpo"]
    stage["sampling"].update(steps=4)
    stage["train"].update(TINY_ROLLOUTS, train_batch_size=4, checkpoint_every=0)
    run = PipelineRun(validate_pipeline(config), tmp_path / "ws")
    results = {node: run.execute(node) for node in run.nodes}
    assert results["train.grpo"].outputs["iteration"] == 1
    export = results["export"].path
    for part in ("lora", "lora_2"):
        assert (export / part / "pytorch_lora_weights.safetensors").is_file()
    assert (export / "transformer_2").is_dir() and (export / "model_index.json").is_file()
    videos, path = sample_prompts(export, ["a red cat"], out=tmp_path / "cat.mp4", steps=4, guidance=5.0)
    assert videos.shape == (1, 3, FRAMES, HEIGHT, WIDTH) and path.stat().st_size > 0
