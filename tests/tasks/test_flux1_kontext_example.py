"""``examples/flux1-kontext.yaml``, shrunk to the tiny random FLUX.1-Kontext folder, a tiny judge and two random
edits, runs end to end through ``PipelineRun``: edit pairs -> conditions -> GRPO judged before/after -> export.
The SFT stage is left out (a stage process costs half a minute here); the default tier trains flux1-kontext with
SFT (``tests/core/trainers/test_pipeline_family_training.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from edit_pairs import EDITS, write_edits
from pretrained_stage import TINY_ROLLOUTS
from tiny_flux1_kontext_pipeline import RESOLUTION, SOURCE_TOKENS
from tiny_sd3_pipeline import T5_LENGTH
from tiny_vlm import build_tiny_vlm

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.edit_prompts import parse_edit_prompt
from flowpost.core.events import read_events
from flowpost.core.models.flux1_kontext import Flux1KontextAdapter
from flowpost.tasks.runner import PipelineRun

EXAMPLE = Path(__file__).parents[2] / "examples" / "flux1-kontext.yaml"
INSTRUCTIONS = ["make it red", "turn the cat into a dog"]


@pytest.mark.slow  # under a minute: the conditions node's 1024 px sources, a stage process, the pipeline export
def test_edit_pairs_train_through_grpo_and_export(flux1_kontext_pipeline_dir, tmp_path: Path) -> None:
    from diffusers import FluxKontextPipeline

    config = yaml.safe_load(EXAMPLE.read_text())
    folder, judge = str(flux1_kontext_pipeline_dir), str(build_tiny_vlm(tmp_path / "judge"))
    config["smoke"] = True
    config["datasets"]["edits"].update(
        path=str(write_edits(tmp_path / "edits", INSTRUCTIONS)),
        preprocess={"resolution": RESOLUTION, "mode": "rgb"},
        split={"eval": 0.0},
    )
    config["conditions"]["kontext"].update(max_length=T5_LENGTH)
    config["conditions"]["kontext"]["model"]["pretrained"] = folder
    del config["stages"]["sft"]
    grpo = config["stages"]["grpo"]
    grpo["model"].update(pretrained=folder, init="scratch", torch_dtype="float32", lora={"rank": 4, "alpha": 8})
    grpo["model"]["options"] = {"resolution": RESOLUTION, "distilled_guidance": 2.5}
    grpo["launch"] = {"mixed_precision": "no"}
    grpo["sampling"].update(steps=3)
    grpo["rewards"][0]["options"] = {"model": judge}
    grpo["train"].update(TINY_ROLLOUTS, train_batch_size=2, checkpoint_every=0, log_every=1)
    run = PipelineRun(validate_pipeline(config), tmp_path / "ws")
    results = {node: run.execute(node) for node in run.nodes}
    assert results["train.grpo"].outputs["iteration"] == 1

    (acquired,) = (tmp_path / "ws" / "acquire.edits").glob("*/manifest.json")
    edits = [parse_edit_prompt(prompt) for prompt in json.loads(acquired.read_text())["train_prompts"]]
    assert len(edits) == EDITS and all(edit is not None for edit in edits)
    (grpo_events,) = (tmp_path / "ws" / "train.grpo").glob("*/events.jsonl")
    (metrics,) = [e["metrics"] for e in read_events(grpo_events) if e["event"] == "progress"]
    assert 0 <= metrics["reward/vlm_edit_judge_mean"] <= 1 and metrics["reward/vlm_edit_judge_std"] >= 0
    export = results["export"].path
    adapter = Flux1KontextAdapter.from_pretrained(export)
    assert adapter.resolution == RESOLUTION and adapter.distilled_guidance == 2.5
    assert adapter.condition_tokens == SOURCE_TOKENS
    stock = FluxKontextPipeline.from_pretrained(export)  # the stock pipeline loads the exported folder
    exported = stock.transformer.state_dict()
    assert all(torch.equal(exported[name], value) for name, value in adapter.module().state_dict().items())
