"""A GRPO iteration of the tiny family rewarded by ``ocr`` (RapidOCR's shipped models) on prompts with quoted
text, acquired from a Flow-GRPO-style prompt file."""

from __future__ import annotations

from pathlib import Path

import pytest
from prompt_states import seeded_prompt_states

from flowpost.core.config.schema.datasets import PromptFilesDataset
from flowpost.core.events import read_events
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.data.condition_cache import update_condition_cache
from flowpost.tasks.acquire import acquire_prompt_files

PROMPTS = ['a sign that says "OPEN"', 'a poster reading "42"']
FINGERPRINT = "test-encoder"  # the one make_trainer's spec names


def test_a_grpo_iteration_scores_every_rollout_with_ocr(
    make_trainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("test.txt").write_text("".join(f"{prompt}\n" for prompt in PROMPTS))
    acquire_prompt_files(PromptFilesDataset(path="test.txt"), tmp_path / "prompts", where="datasets.ocr")
    update_condition_cache(
        tmp_path / "conditions", ["", *PROMPTS], encoder_fingerprint=FINGERPRINT, encode=seeded_prompt_states
    )
    trainer = make_trainer(
        tmp_path / "out",
        cls=GRPOTrainer,
        dirs=(tmp_path / "prompts", tmp_path / "conditions"),
        rewards=[{"name": "ocr"}],
        sampling={"steps": 2},
        iterations=1,
        log_every=1,
        prompts_per_iteration=2,
        group_size=4,
        rollout_batch_size=8,
        train_batch_size=4,
    )
    progress = trainer.start()
    assert (progress.rollout_iteration, progress.optimizer_step) == (1, 2)
    (metrics,) = [e["metrics"] for e in read_events(tmp_path / "out" / "events.jsonl") if e["event"] == "progress"]
    # a tiny random model draws no legible text: the scores are OCR's similarity of nothing read to the quote
    assert 0.0 <= metrics["reward/ocr_mean"] <= 1.0 and metrics["reward/total_mean"] == metrics["reward/ocr_mean"]
