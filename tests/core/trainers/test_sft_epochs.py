"""SFT under the dataset contract: epoch accounting, accumulation windows, failures, resume."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.trainers.offline.sft import SFTTrainer

# 20 records at batch 4: 5 batches per epoch; with accumulation 2, 4 usable and 2 optimizer steps.


class CountingSFT(SFTTrainer):
    micro_batches = 0

    def optimize_batch(self, batch):  # type: ignore[no-untyped-def]
        type(self).micro_batches += 1
        return super().optimize_batch(batch)


def test_clean_exhaustion_advances_the_epoch_and_skips_the_partial_window(make_trainer, tmp_path):
    CountingSFT.micro_batches = 0
    trainer = make_trainer(tmp_path, cls=CountingSFT, gradient_accumulation_steps=2, max_steps=2)
    progress = trainer.start()
    assert (progress.optimizer_step, progress.data_epoch, progress.epoch_cursor) == (2, 1, 0)
    assert CountingSFT.micro_batches == 4  # the fifth batch would be a partial window: never used


def test_stopping_mid_epoch_keeps_the_cursor(make_trainer, tmp_path):
    progress = make_trainer(tmp_path, gradient_accumulation_steps=2, max_steps=3).start()
    assert (progress.optimizer_step, progress.data_epoch, progress.epoch_cursor) == (3, 1, 2)


class FailingSFT(SFTTrainer):
    calls = 0

    def optimize_batch(self, batch):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        if type(self).calls == 4:
            raise RuntimeError("bad batch")
        return super().optimize_batch(batch)


def test_a_failing_batch_does_not_advance_the_epoch(make_trainer, tmp_path):
    FailingSFT.calls = 0
    trainer = make_trainer(tmp_path, cls=FailingSFT, gradient_accumulation_steps=2, max_steps=2)
    with pytest.raises(RuntimeError, match="bad batch"):
        trainer.start()
    assert (trainer.progress.optimizer_step, trainer.progress.data_epoch) == (1, 0)
    assert trainer.progress.epoch_cursor == 2


def _weights(trainer: SFTTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.adapter.module().state_dict().items()}


def test_resume_from_a_mid_epoch_checkpoint_is_bit_identical(make_trainer, tmp_path):
    straight = make_trainer(tmp_path / "straight", gradient_accumulation_steps=2, max_steps=5, resume=False)
    straight.start()
    interrupted = make_trainer(tmp_path / "resumed", gradient_accumulation_steps=2, max_steps=3, checkpoint_every=1)
    interrupted.start()  # stops at step 3: mid epoch 1 (cursor 2)
    resumed = make_trainer(tmp_path / "resumed", gradient_accumulation_steps=2, max_steps=5, checkpoint_every=1)
    progress = resumed.start()
    assert progress.optimizer_step == 5 and progress.data_epoch == 2
    expected, actual = _weights(straight), _weights(resumed)
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[k], actual[k]) for k in expected)


def test_final_weights_and_events_are_written(make_trainer, tmp_path):
    from flowpost.core.events import read_events

    trainer = make_trainer(tmp_path, gradient_accumulation_steps=2, max_steps=2, callbacks={"ema": {"decay": 0.5}})
    trainer.start()
    assert (tmp_path / "final" / "live" / "transformer" / "config.json").exists()
    assert (tmp_path / "final" / "ema" / "transformer" / "config.json").exists()
    kinds = [e["event"] for e in read_events(tmp_path / "events.jsonl")]
    assert kinds[0] == "start" and kinds[-1] == "done" and "checkpoint" in kinds
    live = TinySD3Adapter.from_pretrained(tmp_path / "final" / "live").module().state_dict()
    ema = TinySD3Adapter.from_pretrained(tmp_path / "final" / "ema").module().state_dict()
    assert any(not torch.equal(live[k], ema[k]) for k in live)


def test_keep_last_leaves_only_the_newest_checkpoints(make_trainer, tmp_path):
    make_trainer(tmp_path, max_steps=4, checkpoint_every=1, keep_last=2).start()
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-3", "step-4"]


def test_a_checkpoint_with_position_keyed_optimizer_state_is_refused_with_a_way_out(make_trainer, tmp_path):
    import dataclasses

    from flowpost.core.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from flowpost.errors import FlowpostError

    make_trainer(tmp_path, max_steps=1, checkpoint_every=1).start()
    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"), verified=True)
    named = state.optimizer
    by_position = {"state": dict(enumerate(named["state"].values())), "param_groups": named["param_groups"]}
    save_checkpoint(tmp_path / "checkpoints", dataclasses.replace(state, step=2, optimizer=by_position))
    with pytest.raises(FlowpostError, match="by position.*--no-resume"):
        make_trainer(tmp_path, max_steps=3, checkpoint_every=1).start()
