"""``examples/qwen-image-edit.yaml``, shrunk to the tiny random Qwen-Image-Edit folder, a tiny judge and two random
edits, runs under ``flowpost run``: edit pairs -> conditions -> SFT -> GRPO judged before/after -> export; and
switched to the Edit-Plus family on edits of two sources, as its comments say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from edit_pairs import EDITS, write_edits
from pretrained_stage import TINY_ROLLOUTS
from tiny_qwen_image_edit_pipeline import INSTRUCTIONS, MAX_LENGTH, RESOLUTION, load_stock_edit_pipeline
from tiny_vlm import build_tiny_vlm

from flowpost.core.edit_prompts import parse_edit_sources, source_file
from flowpost.core.events import read_events
from flowpost.core.models.registry import load_adapter

EXAMPLE = Path(__file__).parents[2] / "examples" / "qwen-image-edit.yaml"


FAMILIES = {  # family -> its tiny folder's fixture, the further source columns, its stock pipeline
    "qwen-image-edit": ("qwen_image_edit_pipeline_dir", (), "QwenImageEditPipeline"),
    "qwen-image-edit-plus": ("qwen_image_edit_plus_pipeline_dir", ("second",), "QwenImageEditPlusPipeline"),
}


@pytest.mark.slow  # about 2 min here each: a Prefect server, two stage processes, 1024 px sources
@pytest.mark.parametrize("family", list(FAMILIES))
def test_edit_pairs_train_through_sft_and_grpo_and_export(request, family: str, tmp_path: Path) -> None:
    fixture, more, pipeline_class = FAMILIES[family]
    config = yaml.safe_load(EXAMPLE.read_text())
    folder, judge = str(request.getfixturevalue(fixture)), str(build_tiny_vlm(tmp_path / "judge"))
    config["smoke"] = True
    config["datasets"]["edits"].update(
        path=str(write_edits(tmp_path / "edits", INSTRUCTIONS, more=more)),
        preprocess={"resolution": RESOLUTION, "mode": "rgb"},
        split={"eval": 0.0},
        **({"more_source_columns": list(more)} if more else {}),
    )
    config["conditions"]["qwen"].update(max_length=MAX_LENGTH)
    config["conditions"]["qwen"]["model"].update(family=family, pretrained=folder)
    for name in ("sft", "grpo"):
        stage = config["stages"][name]
        stage["model"].update(family=family, pretrained=folder, torch_dtype="float32", lora={"rank": 4, "alpha": 8})
        stage["model"]["options"] = {"resolution": RESOLUTION, **({"sources": len(more) + 1} if more else {})}
        stage["launch"] = {"mixed_precision": "no"}
    config["stages"]["sft"]["train"].update(batch_size=2, max_steps=2, checkpoint_every=0)
    grpo = config["stages"]["grpo"]
    grpo["sampling"].update(steps=3)
    grpo["rewards"][0]["options"] = {"model": judge}
    grpo["train"].update(TINY_ROLLOUTS, train_batch_size=2, checkpoint_every=0, log_every=1)
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config, sort_keys=False))  # stages in order
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "flowpost.cli", "run", "pipeline.yaml", "--workspace", "ws"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr

    (acquired,) = (tmp_path / "ws" / "acquire.edits").glob("*/manifest.json")
    edits = [parse_edit_sources(prompt) for prompt in json.loads(acquired.read_text())["train_prompts"]]
    assert len(edits) == EDITS and all(edit is not None and len(edit[1]) == len(more) + 1 for edit in edits)
    assert all(source_file(acquired.parent / "assets", digest).is_file() for _, digests in edits for digest in digests)
    (sft_events,) = (tmp_path / "ws" / "train.sft").glob("*/events.jsonl")
    assert any(e["event"] == "done" for e in read_events(sft_events))
    (grpo_events,) = (tmp_path / "ws" / "train.grpo").glob("*/events.jsonl")
    (metrics,) = [e["metrics"] for e in read_events(grpo_events) if e["event"] == "progress"]
    assert 0 <= metrics["reward/vlm_edit_judge_mean"] <= 1 and metrics["reward/vlm_edit_judge_std"] >= 0
    (export,) = (path.parent for path in (tmp_path / "ws" / "export").glob("*/model_index.json"))
    adapter = load_adapter(export)
    assert adapter.family == family and adapter.resolution == RESOLUTION and adapter.sources == len(more) + 1
    stock = load_stock_edit_pipeline(export, pipeline_class)  # the stock edit pipeline loads the exported folder
    exported = stock.transformer.state_dict()
    trained = adapter.module().state_dict()
    assert all(torch.equal(exported[name], value) for name, value in trained.items())
