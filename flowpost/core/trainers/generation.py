"""GenerationTrainer: the generation contracts. Each rollout iteration samples, (with runtime
rewards) is scored with group advantages by the loop, then optimised in shuffled micro-batches."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from flowpost.core.contracts import Acquisition, Feedback, Paradigm
from flowpost.core.distributed import mean_over_ranks
from flowpost.core.residency import attribute_networks
from flowpost.core.rewards.combine import WeightedRewards
from flowpost.core.trainers.arguments import OnlineArguments, groups_fit_ranks
from flowpost.core.trainers.base import BaseTrainer
from flowpost.core.trainers.objective import Metrics, Objective, accumulate, to_host
from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.core.trainers.role_plan import RoleUpdatePlan
from flowpost.core.trainers.rollout_engine import RolloutEngine
from flowpost.errors import FlowpostError

MicroBatchObjective = Callable[[Rollout, float], Objective]
RoleObjective = Callable[[Rollout, float, str], Objective]


class GenerationTrainer(BaseTrainer):
    """Implements ``sample`` and ``optimize``; the budget is rollout iterations."""

    acquisition: ClassVar[Acquisition] = Acquisition.GENERATION
    arguments_base: ClassVar[type[OnlineArguments]] = OnlineArguments
    keeps_rollout_states: ClassVar[bool] = False  # store the trajectory although the objective is not coupled
    whole_groups: ClassVar[bool] = False  # micro-batches shuffle whole groups (train_batch_size holds them)
    groups_on_one_rank: ClassVar[bool] = False  # a group's samples meet on one rank (implied by whole_groups)
    engine: ClassVar[type[RolloutEngine]] = RolloutEngine  # how its rollouts are sampled
    args: OnlineArguments

    def __init__(self, *, rewards: WeightedRewards | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        wants_rewards = self.execution_contract.feedback is Feedback.RUNTIME_REWARD
        if wants_rewards != (rewards is not None):
            need = "needs at least one reward" if wants_rewards else "uses no reward"
            raise FlowpostError(f"trainer {type(self).__name__} {need}", where=f"stages.{self.stage}.rewards")
        self.rollouts = self.engine(
            adapter=self.adapter,
            accelerator=self.accelerator,
            args=self.args,
            sampling=self.sampling,
            inputs=self.inputs,
            seed=self.spec.seed,
            stage=self.stage,
            store=self.paradigm is Paradigm.COUPLED or self.keeps_rollout_states,
            collective_passes=self.parallel.collective_passes,
            rewards=rewards,
        )
        if rewards is not None and "rewards" in self.spec.offload:
            networks = attribute_networks(rewards)  # built with their models: found once
            self.residency.add("rewards", lambda: networks, self.scoring_phases())

    def check_ranks(self) -> None:
        """Each group stays on one rank where the trainer compares its samples: the prompts split evenly."""
        if self.whole_groups or self.groups_on_one_rank:
            groups_fit_ranks(
                self.args.prompts_per_iteration,
                self.accelerator.num_processes,
                where=f"stages.{self.stage}.train.prompts_per_iteration",
            )

    def scoring_phases(self) -> set[str]:
        """The phases that decode and score rollouts: ``reward``, and ``rollout`` too with ``overlap_rewards``."""
        return {"reward", "rollout"} if self.args.overlap_rewards else {"reward"}

    def codec_phases(self) -> set[str]:
        return super().codec_phases() | self.scoring_phases()

    @abstractmethod
    def sample(self) -> Rollout:
        """One acquisition cycle of samples (usually ``self.rollouts.generate``)."""

    @abstractmethod
    def optimize(self, samples: Rollout) -> Metrics:
        """Update the policy from one cycle's samples (``train_on_rollout``, ``train_roles_on_rollout``);
        return the cycle's metrics (tensors among them are read once, at the cycle's end)."""

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
        """sample -> (rewards and advantages) -> optimize, once per iteration; each a phase of the ledger
        (rollout, reward, optimize), bounded where the iteration already waits for the device."""
        while self.progress.rollout_iteration < budget:
            with self.phase("rollout"):
                samples = self.sample()
            self.cycle_metrics = {}
            if self.execution_contract.feedback is Feedback.RUNTIME_REWARD:
                with self.phase("reward"):
                    self.cycle_metrics = mean_over_ranks(self.rollouts.score(samples))
            with self.phase("optimize"):
                metrics = self.cycle_metrics | to_host(self.optimize(samples))[0]
                self.progress = self.progress.after_rollout()
                metrics |= self._after_acquisition_cycle()
            self.ledger.count(self.args.samples_per_iteration)
            self._end_budget_unit(budget, metrics)

    def train_on_rollout(self, samples: Rollout, objective: MicroBatchObjective) -> dict[str, float]:
        """``inner_epochs`` passes over ``samples`` in micro-batches, stepping every accumulation.

        ``objective(micro_batch, scale)`` yields the parts of its mean loss times ``scale`` and returns
        its metrics (means over its rows); the loop backpropagates the parts and sums the metrics on the
        device. A rank without rows in a micro-batch skips it but still takes part in the step's gradient
        average. A trailing partial accumulation window is dropped unless it is the only one. Returns the
        last optimizer step's metrics.
        """
        accum, iteration = self.args.gradient_accumulation_steps, self.progress.rollout_iteration
        metrics: dict[str, float] = {}
        for epoch in range(self.args.inner_epochs):
            block = self.args.group_size if self.whole_groups else 1
            batches = self.rollouts.micro_batches(len(samples), iteration, epoch, block=block)
            usable = len(batches) - len(batches) % accum or len(batches)
            sums: Metrics = {}
            for number, batch in enumerate(batches[:usable]):
                if batch.rows:
                    values = self.backpropagate(objective(samples.select(batch.rows), batch.share / accum))
                    accumulate(sums, values, scale=batch.share, divisor=accum)
                if (number + 1) % accum == 0 or number + 1 == usable:
                    metrics |= self.step_optimizer(sums)
                    sums = {}
        return metrics

    def train_roles_on_rollout(
        self, samples: Rollout, plan: RoleUpdatePlan, objectives: dict[str, RoleObjective]
    ) -> dict[str, float]:
        """One round of ``plan`` per shuffled micro-batch of ``samples``, one optimizer step per update.

        ``objectives[role](micro_batch, scale, tag)`` yields the parts of that role's mean loss times
        ``scale`` and returns its metrics; ``tag`` (``"<micro-batch>-<update>"``) addresses the update's
        noise. Micro-batches hold whole groups when ``whole_groups`` is set. A rank without rows in a
        micro-batch still takes part in every step. Returns the last metrics of each role.
        """
        metrics: dict[str, float] = {}
        block = self.args.group_size if self.whole_groups else 1
        iteration = self.progress.rollout_iteration
        for number, batch in enumerate(self.rollouts.micro_batches(len(samples), iteration, 0, block=block)):
            part = samples.select(batch.rows) if batch.rows else None
            for update, role in enumerate(plan.round()):
                tag = f"{number}-{update}"
                values = self.backpropagate(objectives[role](part, batch.share, tag)) if part is not None else {}
                metrics |= self.step_role(role, values)
        return metrics
