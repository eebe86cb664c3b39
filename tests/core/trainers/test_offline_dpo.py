"""Offline DPO: the loss forms, the margin and gradient at the reference, epochs over pairs, resume, errors."""

from __future__ import annotations

import math

import pytest
import torch

from flowpost.core.events import read_events
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.offline.dpo import OfflineDPOTrainer
from flowpost.core.trainers.preference import implicit_rewards, preference_loss, preference_margin
from flowpost.errors import FlowpostError

# 20 pairs at batch 4: 5 batches per epoch; with accumulation 2, 4 usable and 2 optimizer steps.


def test_zero_margin_costs_log_2_and_hinge_and_ipo_follow_their_closed_forms():
    zero = torch.zeros(3)
    assert preference_loss(zero, beta=2500.0).tolist() == pytest.approx([math.log(2)] * 3)
    z = torch.tensor([-0.1, 0.0, 0.1, 0.3])
    beta = 10.0  # b = beta / 2 = 5
    assert preference_loss(z, beta=beta, loss_type="hinge").tolist() == pytest.approx([1.5, 1.0, 0.5, 0.0])
    assert preference_loss(z, beta=beta, loss_type="ipo").tolist() == pytest.approx([0.04, 0.01, 0.0, 0.04])
    sigmoid = preference_loss(z, beta=beta).tolist()
    assert sigmoid == pytest.approx([math.log1p(math.exp(-5 * v)) for v in z.tolist()])


def test_implicit_rewards_differ_by_the_scaled_margin():
    policy_w, policy_l, ref_w, ref_l = (torch.tensor([v]) for v in (0.2, 0.6, 0.3, 0.5))
    reward_w, reward_l = implicit_rewards(policy_w, policy_l, ref_w, ref_l, beta=4.0)
    assert reward_w.item() == pytest.approx(0.2)  # -2 * (0.2 - 0.3)
    assert reward_l.item() == pytest.approx(-0.2)  # -2 * (0.6 - 0.5)
    margin = preference_margin(policy_w, policy_l, ref_w, ref_l)
    assert (reward_w - reward_l).item() == pytest.approx(2.0 * margin.item())


def _dpo(make_trainer, pair_data_dirs, out, **args):  # noqa: ANN001, ANN202
    return make_trainer(out, cls=OfflineDPOTrainer, dirs=pair_data_dirs, init_from=out, **args)


def _gradients(trainer: OfflineDPOTrainer, batch: dict) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    trainer.optimizer.zero_grad(set_to_none=True)
    outputs = trainer.optimize_batch(batch)
    outputs["loss"].backward()
    grads = {n: p.grad.clone() for n, p in trainer.adapter.module().named_parameters() if p.grad is not None}
    return grads, outputs


def test_at_the_reference_the_margin_is_zero_and_swapping_the_arms_flips_the_gradient(
    make_trainer, pair_data_dirs, tmp_path
):
    trainer = _dpo(make_trainer, pair_data_dirs, tmp_path)
    batch = next(trainer.build_loader().iter_epoch(0))
    grads, outputs = _gradients(trainer, batch)
    assert float(outputs["margin"]) == pytest.approx(0.0, abs=1e-7)
    assert float(outputs["loss"].detach()) == pytest.approx(math.log(2), abs=1e-6)
    assert float(outputs["implicit_accuracy"]) == pytest.approx(0.5)
    swapped, _ = _gradients(trainer, batch | {"chosen": batch["rejected"], "rejected": batch["chosen"]})
    assert grads and grads.keys() == swapped.keys()
    assert any(float(g.abs().max()) > 0 for g in grads.values())
    flat = torch.cat([g.flatten() for g in grads.values()])
    flat_swapped = torch.cat([swapped[name].flatten() for name in grads])
    assert float((flat + flat_swapped).norm() / flat.norm()) < 1e-4  # the same gradient, opposite sign


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo"])
def test_training_raises_the_margin_and_keeps_the_reference_frozen(make_trainer, pair_data_dirs, tmp_path, loss_type):
    trainer = _dpo(make_trainer, pair_data_dirs, tmp_path, max_steps=6, beta=200.0, loss_type=loss_type, lr=3e-3)
    initial = {k: v.clone() for k, v in trainer.adapter.snapshots.state_dict(Snapshot.REFERENCE).items()}
    trainer.start()
    batch = next(trainer.build_loader().iter_epoch(0))
    with torch.no_grad():
        outputs = trainer.optimize_batch(batch)
    assert float(outputs["margin"]) > 0 and float(outputs["implicit_accuracy"]) > 0.5
    assert float(outputs["reward_margin"]) > 0
    reference = trainer.adapter.snapshots.state_dict(Snapshot.REFERENCE)
    assert all(torch.equal(initial[k], reference[k]) for k in initial)
    live = dict(trainer.adapter.module().named_parameters())
    assert any(not torch.equal(live[k].detach(), initial[k]) for k in initial)
    steps = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "progress"]
    assert {"loss", "margin", "implicit_accuracy", "reward_chosen", "reward_rejected", "reward_margin"} <= set(
        steps[-1]["metrics"]
    )


class IndexRecordingDPO(OfflineDPOTrainer):
    seen: list[tuple[int, list[int]]] = []

    def optimize_batch(self, batch):  # type: ignore[no-untyped-def]
        type(self).seen.append((self.progress.data_epoch, batch["index"].tolist()))
        return super().optimize_batch(batch)


def test_an_epoch_visits_every_usable_pair_once_and_skips_the_partial_window(make_trainer, pair_data_dirs, tmp_path):
    IndexRecordingDPO.seen = []
    trainer = make_trainer(
        tmp_path,
        cls=IndexRecordingDPO,
        dirs=pair_data_dirs,
        init_from=tmp_path,
        gradient_accumulation_steps=2,
        max_steps=4,
    )
    progress = trainer.start()
    assert (progress.optimizer_step, progress.data_epoch, progress.epoch_cursor) == (4, 2, 0)
    for epoch in (0, 1):
        indices = [i for e, batch in IndexRecordingDPO.seen if e == epoch for i in batch]
        assert len(indices) == len(set(indices)) == 16  # 4 of the 5 batches: the fifth is a partial window
    epochs = [sorted(i for e, b in IndexRecordingDPO.seen if e == epoch for i in b) for epoch in (0, 1)]
    assert epochs[0] != epochs[1]  # a fresh permutation per epoch


def test_resume_from_a_mid_epoch_checkpoint_is_bit_identical(make_trainer, pair_data_dirs, tmp_path):
    straight = _dpo(make_trainer, pair_data_dirs, tmp_path / "straight", max_steps=4, resume=False)
    straight.start()
    _dpo(make_trainer, pair_data_dirs, tmp_path / "resumed", max_steps=2, checkpoint_every=1).start()
    resumed = _dpo(make_trainer, pair_data_dirs, tmp_path / "resumed", max_steps=4, checkpoint_every=1)
    assert resumed.start().optimizer_step == 4
    expected, actual = straight.adapter.module().state_dict(), resumed.adapter.module().state_dict()
    assert all(torch.equal(expected[k], actual[k]) for k in expected)


def test_a_scratch_start_has_no_reference_and_is_refused_naming_model_init(make_trainer, pair_data_dirs, tmp_path):
    with pytest.raises(FlowpostError, match="frozen reference") as error:
        make_trainer(tmp_path, cls=OfflineDPOTrainer, dirs=pair_data_dirs)
    assert error.value.where == "stages.sft.model.init"


def test_demonstrations_are_not_preference_pairs(make_trainer, tmp_path):
    with pytest.raises(FlowpostError, match="preferences") as error:
        make_trainer(tmp_path, cls=OfflineDPOTrainer, init_from=tmp_path)
    assert error.value.where == "stages.sft.data.dataset"
