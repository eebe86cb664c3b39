"""SFT under the dataset contract: epoch accounting, accumulation windows, failures, resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flowpost.core.io import write_json_atomic
from flowpost.core.models.base import ConditionBatch
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.trainers.offline.sft import SFTArguments, SFTTrainer
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.condition_cache import update_condition_cache
from flowpost.data.records import Demonstration
from flowpost.data.shards import write_shards

TINY = {
    "num_layers": 1,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "caption_projection_dim": 16,
}
RECORDS = 20  # batch 4 -> 5 batches per epoch; accumulation 2 -> 4 usable, 2 optimizer steps per epoch
FINGERPRINT = "test-encoder"


def _fake_encode(prompts: list[str]) -> ConditionBatch:
    seeds = [sum(map(ord, p)) for p in prompts]
    states = torch.stack([torch.randn(16, 384, generator=torch.Generator().manual_seed(s)) for s in seeds])
    return ConditionBatch(states, torch.ones(len(prompts), 16, dtype=torch.int8), states.mean(1))


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sft-data")
    rng = np.random.default_rng(0)
    records = [
        Demonstration(
            key=f"r{i}",
            prompt=f"digit {i % 10}",
            image=rng.random((1, 16, 16), dtype=np.float32),
            label=i % 10,
        )
        for i in range(RECORDS)
    ]
    manifest = write_shards(records, root / "data" / "train", shard_size=7)
    write_json_atomic(root / "data" / "train" / "manifest.json", manifest)
    prompts = ["", *sorted({r.prompt for r in records})]
    update_condition_cache(root / "conditions", prompts, encoder_fingerprint=FINGERPRINT, encode=_fake_encode)
    return root / "data", root / "conditions"


def _trainer(
    data_dirs: tuple[Path, Path],
    out: Path,
    *,
    cls: type[SFTTrainer] = SFTTrainer,
    resume: bool = True,
    **args: object,
) -> SFTTrainer:
    dataset_dir, conditions_dir = data_dirs
    spec = StageSpec(
        stage="sft",
        seed=0,
        config={},
        output_dir=str(out),
        dataset_dir=str(dataset_dir),
        conditions_dir=str(conditions_dir),
        encoder_fingerprint=FINGERPRINT,
        resume=resume,
    )
    arguments = SFTArguments(batch_size=4, gradient_accumulation_steps=2, lr=1e-3, **args)
    adapter = TinySD3Adapter.from_scratch(seed=0, overrides=TINY)
    return cls(spec=spec, args=arguments, adapter=adapter)


class CountingSFT(SFTTrainer):
    micro_batches = 0

    def optimize_batch(self, batch):  # type: ignore[no-untyped-def]
        type(self).micro_batches += 1
        return super().optimize_batch(batch)


def test_clean_exhaustion_advances_the_epoch_and_skips_the_partial_window(data_dirs, tmp_path):
    CountingSFT.micro_batches = 0
    trainer = _trainer(data_dirs, tmp_path, cls=CountingSFT, max_steps=2)
    progress = trainer.start()
    assert (progress.optimizer_step, progress.data_epoch, progress.epoch_cursor) == (2, 1, 0)
    assert CountingSFT.micro_batches == 4  # the fifth batch would be a partial window: never used


def test_stopping_mid_epoch_keeps_the_cursor(data_dirs, tmp_path):
    progress = _trainer(data_dirs, tmp_path, max_steps=3).start()
    assert (progress.optimizer_step, progress.data_epoch, progress.epoch_cursor) == (3, 1, 2)


class FailingSFT(SFTTrainer):
    calls = 0

    def optimize_batch(self, batch):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        if type(self).calls == 4:
            raise RuntimeError("bad batch")
        return super().optimize_batch(batch)


def test_a_failing_batch_does_not_advance_the_epoch(data_dirs, tmp_path):
    FailingSFT.calls = 0
    trainer = _trainer(data_dirs, tmp_path, cls=FailingSFT, max_steps=2)
    with pytest.raises(RuntimeError, match="bad batch"):
        trainer.start()
    assert (trainer.progress.optimizer_step, trainer.progress.data_epoch) == (1, 0)
    assert trainer.progress.epoch_cursor == 2


def _weights(trainer: SFTTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.adapter.module().state_dict().items()}


def test_resume_from_a_mid_epoch_checkpoint_is_bit_identical(data_dirs, tmp_path):
    straight = _trainer(data_dirs, tmp_path / "straight", max_steps=5, resume=False)
    straight.start()
    interrupted = _trainer(data_dirs, tmp_path / "resumed", max_steps=3, checkpoint_every=1)
    interrupted.start()  # stops at step 3: mid epoch 1 (cursor 2)
    resumed = _trainer(data_dirs, tmp_path / "resumed", max_steps=5, checkpoint_every=1)
    progress = resumed.start()
    assert progress.optimizer_step == 5 and progress.data_epoch == 2
    expected, actual = _weights(straight), _weights(resumed)
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[k], actual[k]) for k in expected)


def test_final_weights_and_events_are_written(data_dirs, tmp_path):
    from flowpost.core.callbacks.ema import EMACallback
    from flowpost.core.events import read_events

    trainer = _trainer(data_dirs, tmp_path, max_steps=2)
    trainer.callbacks.callbacks.append(EMACallback(decay=0.5, warmup=False))
    trainer.start()
    assert (tmp_path / "final" / "live" / "transformer" / "config.json").exists()
    assert (tmp_path / "final" / "ema" / "transformer" / "config.json").exists()
    kinds = [e["event"] for e in read_events(tmp_path / "events.jsonl")]
    assert kinds[0] == "start" and kinds[-1] == "done" and "checkpoint" in kinds
    live = TinySD3Adapter.from_pretrained(tmp_path / "final" / "live").module().state_dict()
    ema = TinySD3Adapter.from_pretrained(tmp_path / "final" / "ema").module().state_dict()
    assert any(not torch.equal(live[k], ema[k]) for k in live)
