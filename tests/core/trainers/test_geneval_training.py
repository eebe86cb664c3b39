"""A GRPO iteration of the tiny family rewarded by ``geneval`` on an acquired GenEval prompt set, with a tiny
detector that sees a cat in some images and not in others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from prompt_states import seeded_prompt_states
from tiny_clip import build_tiny_clip
from tiny_detr import build_tiny_detr

from flowpost.core.config.schema.datasets import PromptFilesDataset
from flowpost.core.events import read_events
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.data.condition_cache import update_condition_cache
from flowpost.tasks.acquire import acquire_prompt_files

ROWS = [
    {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
    {
        "tag": "counting",
        "include": [{"class": "cat", "count": 2}],
        "exclude": [{"class": "cat", "count": 3}],
        "prompt": "a photo of two cats",
    },
]
FINGERPRINT = "test-encoder"  # the one make_trainer's spec names


def test_a_grpo_iteration_trains_on_geneval(make_trainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("evaluation_metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    acquire_prompt_files(PromptFilesDataset(path="evaluation_metadata.jsonl"), tmp_path / "prompts", where="datasets.g")
    prompts = ["", *(row["prompt"] for row in ROWS)]
    update_condition_cache(
        tmp_path / "conditions", prompts, encoder_fingerprint=FINGERPRINT, encode=seeded_prompt_states
    )
    options = {
        "detector": str(build_tiny_detr(tmp_path / "detr", sure=("cat", (0.5, 0.5, 0.4, 0.4)), gain=500, level=0.166)),
        "clip": str(build_tiny_clip(tmp_path / "clip")),
        "max_overlap": 0.5,  # the queries' identical boxes are one cat, seen or not depending on the image
    }
    trainer = make_trainer(
        tmp_path / "out",
        cls=GRPOTrainer,
        dirs=(tmp_path / "prompts", tmp_path / "conditions"),
        rewards=[{"name": "geneval", "options": options}],
        sampling={"steps": 3},
        iterations=1,
        log_every=1,
        prompts_per_iteration=2,
        group_size=4,
        rollout_batch_size=8,
        train_batch_size=4,
    )
    before = {name: p.detach().clone() for name, p in trainer.adapter.module().named_parameters() if p.requires_grad}
    trainer.start()
    (metrics,) = [e["metrics"] for e in read_events(tmp_path / "out" / "events.jsonl") if e["event"] == "progress"]
    # some rollouts show a cat and others none: scores in {0, 1/2, 1} differing inside some groups
    assert 0 < metrics["reward/geneval_mean"] < 1 and metrics["reward/geneval_std"] > 0
    assert metrics["advantage/advantage_abs_mean"] > 0
    after = dict(trainer.adapter.module().named_parameters())
    assert any(not torch.equal(before[name], after[name]) for name in before)
