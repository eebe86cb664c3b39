"""GenerationTrainer: the generation contracts. Each rollout iteration samples, (with runtime
rewards) is scored with group advantages by the loop, then optimised in shuffled micro-batches."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from flowpost.core.contracts import Acquisition, Feedback, Paradigm
from flowpost.core.distributed import mean_over_ranks
from flowpost.core.rewards.combine import WeightedRewards
from flowpost.core.trainers.arguments import OnlineArguments
from flowpost.core.trainers.base import BaseTrainer
from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.core.trainers.rollout_engine import RolloutEngine
from flowpost.errors import FlowpostError

MicroBatchLoss = Callable[[Rollout, float], dict[str, float]]


class GenerationTrainer(BaseTrainer):
    """Implements ``sample`` and ``optimize``; the budget is rollout iterations."""

    acquisition: ClassVar[Acquisition] = Acquisition.GENERATION
    arguments_base: ClassVar[type[OnlineArguments]] = OnlineArguments
    args: OnlineArguments
    stores_steps: ClassVar[bool] = False  # keep the window's states for training (coupled objectives always do)

    def __init__(self, *, rewards: WeightedRewards | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        wants_rewards = self.execution_contract.feedback is Feedback.RUNTIME_REWARD
        if wants_rewards != (rewards is not None):
            need = "needs at least one reward" if wants_rewards else "uses no reward"
            raise FlowpostError(f"trainer {type(self).__name__} {need}", where=f"stages.{self.stage}.rewards")
        self.rollouts = RolloutEngine(
            adapter=self.adapter,
            accelerator=self.accelerator,
            args=self.args,
            sampling=self.sampling,
            inputs=self.inputs,
            seed=self.spec.seed,
            stage=self.stage,
            store=self.paradigm is Paradigm.COUPLED or self.stores_steps,
            collective_passes=self.parallel.collective_passes,
            rewards=rewards,
        )

    @abstractmethod
    def sample(self) -> Rollout:
        """One acquisition cycle of samples (usually ``self.rollouts.generate``)."""

    @abstractmethod
    def optimize(self, samples: Rollout) -> dict[str, float]:
        """Update the policy from one cycle's samples; return the cycle's metrics."""

    @property
    def budget(self) -> int:
        return self.args.budget

    @property
    def completed_units(self) -> int:
        return self.progress.rollout_iteration

    def generate(self) -> Rollout:
        """This rank's rollout of the current iteration."""
        return self.rollouts.generate(self.progress.rollout_iteration)

    def _run_cycles(self, budget: int) -> None:
        """sample -> (rewards and advantages) -> optimize, once per iteration."""
        while self.progress.rollout_iteration < budget:
            samples = self.sample()
            self.cycle_metrics = {}
            if self.execution_contract.feedback is Feedback.RUNTIME_REWARD:
                self.cycle_metrics = mean_over_ranks(self.rollouts.score(samples))
            metrics = self.cycle_metrics | self.optimize(samples)
            self.progress = self.progress.after_rollout()
            metrics |= self._after_acquisition_cycle()
            self._end_budget_unit(budget, metrics)

    def train_on_rollout(self, samples: Rollout, loss: MicroBatchLoss) -> dict[str, float]:
        """``inner_epochs`` passes over ``samples`` in micro-batches, stepping every accumulation.

        ``loss(micro_batch, scale)`` backpropagates its mean loss times ``scale`` and returns metrics
        (means over its rows); a rank without rows in a micro-batch skips it but still takes part in
        the step's gradient average. A trailing partial accumulation window is dropped unless it is
        the only one. Returns the last optimizer step's metrics.
        """
        accum, iteration = self.args.gradient_accumulation_steps, self.progress.rollout_iteration
        metrics: dict[str, float] = {}
        for epoch in range(self.args.inner_epochs):
            batches = self.rollouts.micro_batches(len(samples), iteration, epoch)
            usable = len(batches) - len(batches) % accum or len(batches)
            sums: dict[str, float] = {}
            for number, batch in enumerate(batches[:usable]):
                if batch.rows:
                    for key, value in loss(samples.select(batch.rows), batch.share / accum).items():
                        sums[key] = sums.get(key, 0.0) + value * batch.share / accum
                if (number + 1) % accum == 0 or number + 1 == usable:
                    metrics |= self.step_optimizer(sums)
                    sums = {}
        return metrics
