"""The one loop contract: trainers hand the loop tensors, and the loop reads what the network computed back to
the host once per optimizer step, however many micro-batches, replay passes or timesteps the step holds.

On an accelerator every such read (``.item()``, ``float()``, ``bool()``, ``.tolist()``, ``.cpu()``) waits for
the device. On the CPU the test tells them from reads of host data (sigma tables, indices, masks) by tracing
which tensors were computed from the network's weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from flowpost.core.trainers.distill.dmd2 import DMD2Trainer
from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR
from flowpost.core.trainers.objective import to_host
from flowpost.core.trainers.offline.sft import SFTTrainer
from flowpost.core.trainers.rl.awm import AWMTrainer
from flowpost.core.trainers.rl.crd import CRDTrainer
from flowpost.core.trainers.rl.dgpo import DGPOTrainer
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.core.trainers.rl.nft import NFTTrainer
from flowpost.core.trainers.rl.online_dpo import OnlineDPOTrainer

JPEG = [{"name": "jpeg_incompressibility"}]
# 8 samples in micro-batches of 2 with accumulation 2: 4 micro-batches, 2 optimizer steps per iteration
GROUPS = {
    "prompts_per_iteration": 2,
    "group_size": 4,
    "rollout_batch_size": 8,
    "train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "rewards": JPEG,
    "sampling": {"steps": 3},
}
GENERATION = {
    "grpo": {"cls": GRPOTrainer, "replay_steps_per_pass": 1, **GROUPS},  # one backward per replayed step
    "nft": {"cls": NFTTrainer, "kl_beta": 0.0, **GROUPS},
    "awm": {"cls": AWMTrainer, "train_timesteps": 2, **{**GROUPS, "sampling": {"steps": 4}}},
    "dgpo": {
        "cls": DGPOTrainer,
        "train_timesteps": 2,
        **{
            **GROUPS,
            "train_batch_size": 4,
            "gradient_accumulation_steps": 1,
            "sampling": {"dynamics": "ode", "steps": 4},
        },
    },
    "crd": {
        "cls": CRDTrainer,
        "train_timesteps": 2,
        **{**GROUPS, "train_batch_size": 4, "gradient_accumulation_steps": 1, "sampling": {"steps": 4}},
    },
    "online-dpo": {
        "cls": OnlineDPOTrainer,
        "timesteps_per_pair": 2,
        **{**GROUPS, "prompts_per_iteration": 4, "group_size": 2, "train_batch_size": 1},  # 4 pairs
    },
}


class WeightReads(TorchDispatchMode):
    """Counts reads to Python of tensors computed from ``weights`` (on an accelerator, each one a sync)."""

    READS = ("tolist", "cpu", "numpy")

    def __init__(self, weights: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.computed: WeakIdKeyDictionary = WeakIdKeyDictionary({weight: True for weight in weights})
        self.count = 0
        for name in self.READS:
            monkeypatch.setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name)))

    def _counting(self, read: Callable[..., Any]) -> Callable[..., Any]:
        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.count += tensor in self.computed
            return read(tensor, *args, **kwargs)

        return counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t in self.computed for t in pytree.tree_leaves((args, kwargs))):
            self.count += func is torch.ops.aten._local_scalar_dense.default  # item(), float(), bool(), int()
            for tensor in pytree.tree_leaves(out):
                if isinstance(tensor, torch.Tensor):
                    self.computed[tensor] = True
        return out


def _weights(trainer) -> list[torch.Tensor]:  # noqa: ANN001
    return list(trainer.adapter.trainable_network().parameters())


@pytest.mark.parametrize("name", list(GENERATION))
def test_a_generation_trainer_reads_the_device_once_per_optimizer_step(make_trainer, tmp_path, monkeypatch, name):
    trainer = make_trainer(tmp_path, **GENERATION[name])
    samples = trainer.sample()
    trainer.rollouts.score(samples)
    with WeightReads(_weights(trainer), monkeypatch) as reads:
        metrics, _ = to_host(trainer.optimize(samples))
    steps = trainer.progress.optimizer_step
    assert steps == 2 and {"loss", "lr"} <= set(metrics)
    assert reads.count <= steps + 1  # one read per step, and at most one for the iteration's own metrics


def test_each_role_update_of_a_multi_role_trainer_reads_the_device_once(make_trainer, tmp_path, monkeypatch):
    trainer = make_trainer(
        tmp_path,
        cls=DMD2Trainer,
        prompts_per_iteration=4,
        group_size=1,
        rollout_batch_size=4,
        train_batch_size=2,
        ttur=2,
        sampling={"dynamics": "ode", "steps": 2},
        optimizers={GENERATOR: {"lr": 1e-3}, FAKE_SCORE: {"lr": 2e-3}},
    )
    samples = trainer.sample()
    with WeightReads(_weights(trainer), monkeypatch) as reads:
        trainer.optimize(samples)
    updates = trainer.progress.optimizer_step + trainer.roles[FAKE_SCORE].updates
    assert updates == 6 and reads.count == updates


def test_a_dataset_trainer_reads_the_device_once_per_optimizer_step(make_trainer, tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, cls=SFTTrainer, max_steps=2, gradient_accumulation_steps=2)
    with WeightReads(_weights(trainer), monkeypatch) as reads:
        trainer._run_cycles(trainer.budget)
    assert trainer.progress.optimizer_step == 2 and reads.count == 2


def test_the_cost_ledger_adds_no_read_to_a_rollout_iteration(make_trainer, tmp_path, monkeypatch):
    from contextlib import nullcontext

    counts = []
    for timed in (True, False):
        trainer = make_trainer(tmp_path / str(timed), **GENERATION["grpo"])
        if not timed:
            monkeypatch.setattr(trainer.ledger, "phase", lambda name, sync=True: nullcontext())
        with WeightReads(_weights(trainer), monkeypatch) as reads:
            trainer._run_cycles(1)
        assert trainer.progress.optimizer_step == 2 and bool(trainer.ledger.seconds) is timed
        counts.append(reads.count)
    assert counts[0] == counts[1]  # the same reads (the steps', the iteration's, the reward's) timed or not
