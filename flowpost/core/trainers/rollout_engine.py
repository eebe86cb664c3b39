"""The rollout engine of a generating trainer: K-repeat groups, addressed noise, SDE inside a
window; rewards and group advantages; the shuffled micro-batches training passes go through."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from flowpost.core.advantages import (
    advantage_metrics,
    group_advantages,
    per_reward_advantages,
    reward_correlations,
)
from flowpost.core.conditions import NULL_PROMPT, ConditionBatch
from flowpost.core.contracts import Paradigm
from flowpost.core.noise import addressed_generator, addressed_randn
from flowpost.core.rewards.combine import RewardOutput
from flowpost.core.sampling.checks import check_sde_steps
from flowpost.core.trainers.reward_overlap import OverlappedScoring
from flowpost.core.trainers.rl.groups import GroupPlan, plan_groups
from flowpost.core.trainers.rl.rollout import Rollout, sample_trajectory
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.models.base import ModelAdapter
    from flowpost.core.rewards.combine import WeightedRewards
    from flowpost.core.sampling.config import SamplingConfig
    from flowpost.core.trainers.arguments import OnlineArguments
    from flowpost.core.trainers.inputs import StageInputs


@dataclass(frozen=True)
class MicroBatch:
    """This rank's rows of one global micro-batch; ``share`` = rows x world size / global rows."""

    rows: list[int]
    share: float


@dataclass(frozen=True)
class RankShare:
    """This rank's rows of one iteration's groups: the groups drawn (``plan``), the rows' global ``indices`` and
    ``group_ids``, their ``prompts`` and ``metadata`` (with ``group_id``), their conditions on the device, and the
    null prompt's under guidance."""

    plan: GroupPlan
    indices: list[int]
    group_ids: list[int]
    prompts: list[str]
    metadata: list[dict[str, Any]]
    conditions: ConditionBatch
    null: ConditionBatch | None


@dataclass
class RolloutEngine:
    """``generate`` one iteration's samples, ``score`` them, and cut them into ``micro_batches``.

    ``store`` keeps the SDE transitions for replay (coupled objectives); ``collective_passes``
    says every rank must take part in every forward (sharded layouts).
    """

    adapter: ModelAdapter
    accelerator: Any
    args: OnlineArguments
    sampling: SamplingConfig
    inputs: StageInputs
    seed: int
    stage: str
    store: bool
    collective_passes: bool
    rewards: WeightedRewards | None = None
    overlap: OverlappedScoring | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        """Refuse, at load, SDE steps of the model's own sigma grid whose std is unbounded (or zero, for a
        coupled objective): ``core/sampling/checks.py``."""
        sigmas = self.adapter.inference_sigmas(self.sampling.steps)
        coupled = type(self.args).paradigm is Paradigm.COUPLED
        check_sde_steps(sigmas, self.sampling, stage=self.stage, needs_noise=coupled)
        if self.args.overlap_rewards and self.rewards is not None:
            if self.rewards.compares_groups:
                raise FlowpostError(
                    "overlap_rewards scores each forward batch as it is sampled, and a reward of this stage "
                    "compares whole groups; set overlap_rewards: false",
                    where=f"stages.{self.stage}.train.overlap_rewards",
                )
            self.overlap = OverlappedScoring(self._score_part, self.accelerator.device)

    def forward_batches(self, rows: int) -> list[range]:
        """This rank's ``rows`` in the rollout's forward batches (``rollout_batch_size`` over the ranks)."""
        local = max(self.args.rollout_batch_size // self.accelerator.num_processes, 1)
        return [range(start, min(start + local, rows)) for start in range(0, rows, local)]

    def window(self, iteration: int) -> range:
        """The steps sampled with SDE dynamics (and stored for training) in ``iteration``."""
        size = self.sampling.window_size
        low, high = self.sampling.window_starts
        generator = addressed_generator(self.seed, self.stage, iteration, 0, "window")
        start = int(torch.randint(low, high + 1, (1,), generator=generator))
        return range(start, start + size)

    @property
    def ode_solver(self) -> str:
        """How the ODE steps after the window integrate (``sample_trajectory``): Euler."""
        return "euler"

    def grid(self, window: range) -> Tensor:
        """The sigmas an iteration with ``window`` integrates over: the model's ``sampling.steps`` grid."""
        return self.adapter.inference_sigmas(self.sampling.steps)

    def rank_share(self, iteration: int) -> RankShare:
        """This rank's rows of ``iteration``'s K-repeat groups, their prompts and conditions."""
        where = f"stages.{self.stage}.data"
        conditions = self.inputs.require("conditions", where=where)
        pool = self.inputs.require("prompts", where=where)
        plan = plan_groups(
            len(pool),
            prompts=self.args.prompts_per_iteration,
            group_size=self.args.group_size,
            seed=self.seed,
            stage=self.stage,
            iteration=iteration,
        )
        indices = list(plan.rank_slice(self.accelerator.process_index, self.accelerator.num_processes))
        prompts = [pool[plan.prompt_rows[k]][0] for k in indices]
        device = self.accelerator.device
        return RankShare(
            plan=plan,
            indices=indices,
            group_ids=[plan.group_ids[k] for k in indices],
            prompts=prompts,
            metadata=[{**pool[plan.prompt_rows[k]][1], "group_id": plan.group_ids[k]} for k in indices],
            conditions=conditions.lookup(prompts).to(device),
            null=conditions.lookup([NULL_PROMPT]).to(device) if self.sampling.guidance != 1.0 else None,
        )

    def generate(self, iteration: int) -> Rollout:
        """This rank's share of ``iteration``: K-repeat groups, addressed noise, SDE inside the window."""
        sampling = self.sampling
        share = self.rank_share(iteration)
        indices, group_ids, prompts, metadata = share.indices, share.group_ids, share.prompts, share.metadata
        address = {"seed": self.seed, "stage": self.stage, "step": iteration}
        shape = self.adapter.latent_shape
        device = self.accelerator.device
        noise = addressed_randn(
            shape, indices=group_ids if sampling.same_group_noise else indices, purpose="initial", **address
        ).to(device)
        window = self.window(iteration)
        store = self.store
        step_noise = {
            j: addressed_randn(shape, indices=indices, purpose=f"step-{j}", **address).to(device) for j in window
        }
        sigmas = self.grid(window)
        batch, null = share.conditions, share.null
        parts = []
        if self.overlap is not None:
            self.overlap.begin()
        for forward in self.forward_batches(len(indices)):
            rows = list(forward)
            state = self.adapter.prepare_condition_state(batch.index(rows))
            negative = self.adapter.prepare_condition_state(null.index([0] * len(rows))) if null is not None else None
            parts.append(
                sample_trajectory(
                    self.adapter,
                    noise[rows],
                    state,
                    sigmas,
                    window=window,
                    step_noise={j: n[rows] for j, n in step_noise.items()},
                    dynamics=sampling.dynamics,
                    noise_level=sampling.noise_level,
                    guidance=sampling.guidance,
                    negative=negative,
                    store=store,
                    ode_solver=self.ode_solver,
                )
            )
            if self.overlap is not None:  # scored while the next forward batch samples
                self.overlap.submit(parts[-1]["final"], [prompts[r] for r in rows], [metadata[r] for r in rows])
        traj = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
        steps = torch.tensor(list(window) if store else [], dtype=torch.long)
        rollout = Rollout(
            prompts=prompts,
            metadata=metadata,
            group_ids=torch.tensor(group_ids),
            indices=torch.tensor(indices),
            conditions=batch,
            steps=steps,
            sigmas=sigmas[steps],
            sigmas_next=sigmas[steps + 1],
            **traj,
        )
        if self.overlap is not None:
            self.overlap.finish(rollout.final)
        return rollout

    def micro_batches(self, size: int, iteration: int, epoch: int, *, block: int = 1) -> list[MicroBatch]:
        """Pass ``epoch`` (of ``iteration``)'s shuffled micro-batches over a rollout of ``size`` rows per rank.

        The shuffle is over the global rows (rank ``r`` owns ``[r * size, (r + 1) * size)``), or over blocks
        of ``block`` consecutive global rows kept in order (``group_size``: whole groups), and a
        micro-batch is ``train_batch_size`` global rows, so its composition does not depend on the
        world size; each rank trains on the rows it owns, weighted by ``MicroBatch.share``. A rank
        owning none of a micro-batch's rows skips it, except under a sharded layout, where it runs
        row 0 with share 0 (every rank must take part in every forward and backward).
        """
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        generator = addressed_generator(self.seed, self.stage, iteration, epoch, "shuffle")
        blocks = torch.randperm(size * world // block, generator=generator).tolist()
        order = [b * block + r for b in blocks for r in range(block)]
        width = max(self.args.train_batch_size, 1)
        batches = []
        for start in range(0, len(order), width):
            chunk = order[start : start + width]
            rows = [g - rank * size for g in chunk if rank * size <= g < (rank + 1) * size]
            if not rows and self.collective_passes:
                batches.append(MicroBatch([0], 0.0))  # a weightless pass: sharded ranks gather weights together
            else:
                batches.append(MicroBatch(rows, len(rows) * world / len(chunk)))
        return batches

    def score(self, rollout: Rollout) -> dict[str, float]:
        """Rewards of this rank's samples, advantages over the gathered (all-rank) groups."""
        if self.rewards is None:
            raise TypeError("score() needs rewards; this stage has none")
        output = self.overlap.collect(rollout.final) if self.overlap is not None else None
        parts = [slice(rows.start, rows.stop) for rows in self.forward_batches(len(rollout))]
        if output is None and self.rewards.compares_groups:  # whole groups at once, decoded batch by batch
            self._check_whole_groups(rollout.group_ids)
            media = torch.cat([self.adapter.decode(rollout.final[p]).cpu() for p in parts])
            output = self.rewards(media, rollout.prompts, rollout.metadata)
        elif output is None:  # scored here, forward batch by forward batch as the overlap would
            output = RewardOutput.cat(
                [self._score_part(rollout.final[p], rollout.prompts[p], rollout.metadata[p]) for p in parts]
            )
        device = self.accelerator.device
        gathered = RewardOutput(
            total=self.accelerator.gather(output.total.to(device)).cpu(),
            components={k: self.accelerator.gather(v.to(device)).cpu() for k, v in output.components.items()},
        )
        groups = self.accelerator.gather(rollout.group_ids.to(device)).cpu()
        advantages = self._advantages(gathered, self.rewards.weights, groups)
        start = self.accelerator.process_index * len(rollout)
        rollout.rewards = output.total
        rollout.advantages = advantages[start : start + len(rollout)]
        stats = advantage_metrics(gathered.total, groups, advantages, clip=self.args.advantage_clip)
        metrics = self.rewards.metrics(gathered) | {f"advantage/{key}": value for key, value in stats.items()}
        if len(gathered.components) > 1:
            steering = reward_correlations(gathered.components, groups, advantages)
            metrics |= {f"advantage/{name}_corr": value for name, value in steering.items()}
        return metrics

    def _check_whole_groups(self, group_ids: Tensor) -> None:
        """Refuse a rank holding part of a group: a reward comparing groups sees this rank's samples only."""
        sizes = torch.unique(group_ids, return_counts=True)[1]
        if bool((sizes != self.args.group_size).any()):
            raise FlowpostError(
                f"a reward of this stage compares whole groups, and {self.accelerator.num_processes} processes "
                f"split some of the {self.args.prompts_per_iteration} groups; make prompts_per_iteration a "
                "multiple of the number of processes",
                where=f"stages.{self.stage}.train.prompts_per_iteration",
            )

    def _score_part(self, final: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> RewardOutput:
        """The rewards of one forward batch's final samples (decoded, on the host)."""
        assert self.rewards is not None
        return self.rewards(self.adapter.decode(final).cpu(), prompts, metadata)

    def _advantages(self, rewards: RewardOutput, weights: dict[str, float], groups: Tensor) -> Tensor:
        """The gathered samples' advantages (``train.reward_normalisation``): of the weighted sum (``sum``), or
        of each reward normalised in its group, then weighted and summed (``per_reward``, GDPO)."""
        args = self.args
        if args.reward_normalisation == "per_reward":
            parts = [(rewards.components[name], weight) for name, weight in weights.items()]
            return per_reward_advantages(parts, groups, std=args.advantage_std, clip=args.advantage_clip)
        return group_advantages(rewards.total, groups, std=args.advantage_std, clip=args.advantage_clip)
