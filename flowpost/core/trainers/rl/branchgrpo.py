"""BranchGRPO: GRPO on tree rollouts; fused node rewards give each depth its own advantages; pruning.

Each prompt's group is one tree (``tree_rollout.py``). A node's reward fuses its leaves' rewards (their mean,
or path-weighted: a softmax of the child edges' log-densities at each branch, applied bottom-up); the nodes
after step ``j`` of one tree are normalised together (``group_advantages``), and a transition trains with the
advantage of the node it leads to. A transition shared by several leaves trains once. Depth pruning leaves
chosen steps out of training (they are still sampled); width pruning keeps, per tree, only the highest- and
lowest-advantage transitions after the last branch.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from flowpost.core.advantages import group_advantages
from flowpost.core.conditions import ConditionState
from flowpost.core.sampling.sde import StepOutput, sde_step, step_std
from flowpost.core.trainers.objective import Metrics
from flowpost.core.trainers.rl.grpo import GRPOArguments, GRPOTrainer
from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.core.trainers.rl.tree_rollout import TreePlan, TreeRollout, generate_tree
from flowpost.errors import FlowpostError


class BranchGRPOArguments(GRPOArguments):
    """``train:`` of a BranchGRPO stage; ``group_size`` counts a tree's leaves."""

    group_size: int = Field(8, ge=2, description="leaves per tree: branching_factor ** len(branch_steps)")
    branch_steps: list[int] = Field(
        [0, 3, 6], min_length=1, description="sampler steps at which every node splits (increasing; never the last)"
    )
    branching_factor: int = Field(2, ge=2, description="children per node at a branch step")
    branch_noise_scale: float = Field(
        1.0,
        gt=0,
        description="multiplies the noise a branch step draws (the reference's FLUX script uses 4.0); the stored "
        "log-density stays the sampler's transition's, so values above 1 sample off-policy",
    )
    reward_fusion: Literal["mean", "path-weighted"] = Field(
        "mean",
        description="an internal node's reward: mean of its leaves, or path-weighted (at each branch a softmax of "
        "the children's edge log-densities weighs their rewards, bottom-up)",
    )
    depth_pruning: list[int] = Field(
        [], description="sampler steps whose transitions are not trained (still sampled and scored)"
    )
    depth_pruning_slide_every: int = Field(
        0,
        ge=0,
        description="move the depth_pruning window one step earlier every this many iterations, until its first "
        "step reaches the last branch step (0: fixed)",
    )
    width_pruning: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="fraction of each tree's transitions after the last branch that train: the highest- and "
        "lowest-advantage halves (null: all)",
    )

    @model_validator(mode="after")
    def _tree_shape(self) -> BranchGRPOArguments:
        steps = self.branch_steps
        if any(b < 0 for b in steps) or sorted(set(steps)) != steps:
            raise ValueError(f"branch_steps {steps} must be distinct, increasing sampler steps >= 0")
        leaves = self.branching_factor ** len(steps)
        if self.group_size != leaves:
            raise ValueError(
                f"group_size {self.group_size} must equal branching_factor ** len(branch_steps) = {leaves} "
                "(the leaves of one tree)"
            )
        if any(d < 0 for d in self.depth_pruning):
            raise ValueError(f"depth_pruning {self.depth_pruning} holds a negative step")
        if self.zero_advantage != "keep":
            raise ValueError("zero_advantage: drop filters whole samples; branchgrpo weighs transitions, use keep")
        if self.overlap_rewards:
            raise ValueError("overlap_rewards scores flat forward batches; branchgrpo samples trees, set it false")
        return self


def pruned_steps(depths: list[int], iteration: int, *, every: int, last_branch: int) -> set[int]:
    """``depth_pruning`` at ``iteration``: shifted one step earlier every ``every`` iterations (0: never), its
    first step never before ``last_branch``."""
    if not depths or every == 0:
        return set(depths)
    shift = min(iteration // every, max(0, min(depths) - last_branch))
    return {d - shift for d in depths}


def fused_rewards(
    leaf_rewards: Tensor, plan: TreePlan, *, fusion: str, branch_log_probs: Tensor | None = None
) -> list[Tensor]:
    """Node rewards per level: ``levels[k]`` is ``[T, factor ** k]``, the nodes after ``k`` branches.

    ``leaf_rewards`` is ``[T, L]``; ``branch_log_probs`` ``[T, L, K]`` (each leaf's edge log-density at branch
    ``k``) is read by ``path-weighted``.
    """
    trees, leaves = leaf_rewards.shape
    count = len(plan.branch_steps)
    values = leaf_rewards.double()
    if fusion == "mean":
        return [values.view(trees, plan.factor**k, -1).mean(-1) for k in range(count + 1)]
    assert branch_log_probs is not None
    levels = [values]
    for k in reversed(range(count)):
        width = plan.factor ** (k + 1)
        first = torch.arange(width) * (leaves // width)  # a child's first leaf carries its edge log-density
        weights = torch.softmax(branch_log_probs[:, first, k].double().view(trees, -1, plan.factor), dim=-1)
        levels.insert(0, (weights * levels[0].view(trees, -1, plan.factor)).sum(-1))
    return levels


def depth_advantages(
    levels: list[Tensor], plan: TreePlan, stored_steps: list[int], *, std: str = "group", clip: float | None = 5.0
) -> Tensor:
    """``[T * L, S]``: each leaf's advantage at stored step ``i``, of the node after it, normalised among the
    nodes of its tree after that step (``group_advantages``: a lone node gets 0)."""
    trees, leaves = levels[-1].shape
    leaf = torch.arange(leaves)
    columns = []
    for j in stored_steps:
        rewards = levels[sum(1 for b in plan.branch_steps if b <= j)]
        width = rewards.shape[1]
        groups = torch.arange(trees).repeat_interleave(width)
        advantages = group_advantages(rewards.flatten(), groups, std=std, clip=clip).view(trees, width)
        columns.append(advantages[:, leaf // (leaves // width)].flatten())
    return torch.stack(columns, 1).float() if columns else torch.zeros(trees * leaves, 0)


def width_keep(advantages: Tensor, after_last: Tensor, leaves: int, fraction: float) -> Tensor:
    """``[T * L, S]`` bool: per tree, of the transitions in the columns ``after_last`` marks, the ``k // 2``
    highest- and ``k - k // 2`` lowest-advantage ones, ``k = max(2, int(fraction * count))``; the rest kept."""
    keep = torch.ones_like(advantages, dtype=torch.bool)
    columns = after_last.nonzero().flatten()
    if columns.numel() == 0:
        return keep
    trees = advantages.shape[0] // leaves
    pool = advantages[:, columns].reshape(trees, -1)
    k = min(max(2, int(fraction * pool.shape[1])), pool.shape[1])
    order = torch.sort(pool, dim=1, descending=True, stable=True).indices
    chosen = torch.zeros_like(pool, dtype=torch.bool)
    chosen.scatter_(1, order[:, : k // 2], True)
    chosen.scatter_(1, order[:, pool.shape[1] - (k - k // 2) :], True)
    keep[:, columns] = chosen.view(trees * leaves, -1)
    return keep


class BranchGRPOTrainer(GRPOTrainer):
    """Tree rollouts and per-depth advantages; GRPO's PPO-clip and KL, each distinct transition replayed once."""

    Arguments: ClassVar[type[BranchGRPOArguments]] = BranchGRPOArguments
    args: BranchGRPOArguments

    def setup(self) -> None:
        super().setup()
        args, steps = self.args, self.sampling.steps
        where = f"stages.{self.stage}.train"
        if max(args.branch_steps) > steps - 2:
            raise FlowpostError(
                f"branch step {max(args.branch_steps)} is past the last trainable step {steps - 2} of "
                f"sampling.steps={steps}; lower it or raise sampling.steps",
                where=f"{where}.branch_steps",
            )
        if args.depth_pruning and max(args.depth_pruning) > steps - 2:
            raise FlowpostError(
                f"step {max(args.depth_pruning)} is past the last trainable step {steps - 2}",
                where=f"{where}.depth_pruning",
            )
        if args.prompts_per_iteration % self.accelerator.num_processes:
            raise FlowpostError(
                f"{args.prompts_per_iteration} trees do not split evenly over {self.accelerator.num_processes} "
                "processes (a tree is sampled on one)",
                where=f"{where}.prompts_per_iteration",
            )
        self.plan = TreePlan(steps=steps, branch_steps=tuple(args.branch_steps), factor=args.branching_factor)

    def sde_steps(self, iteration: int) -> set[int]:
        """SDE steps of ``iteration``: the sampling window (default: all but the last step) and every branch step."""
        return set(self.rollouts.window(iteration)) | set(self.args.branch_steps)

    def stored_steps(self, iteration: int) -> list[int]:
        """The SDE steps that train in ``iteration``: all but the depth-pruned ones."""
        args = self.args
        pruned = pruned_steps(
            args.depth_pruning, iteration, every=args.depth_pruning_slide_every, last_branch=max(args.branch_steps)
        )
        return sorted(self.sde_steps(iteration) - pruned)

    def sample(self) -> TreeRollout:
        iteration = self.progress.rollout_iteration
        return generate_tree(
            self.rollouts,
            self.plan,
            iteration,
            sde_steps=self.sde_steps(iteration),
            stored_steps=self.stored_steps(iteration),
            branch_noise_scale=self.args.branch_noise_scale,
        )

    def assign_advantages(self, samples: TreeRollout) -> None:
        """Per-depth advantages of the fused node rewards and the transition weights (mean 1 over the rollout)."""
        assert samples.rewards is not None and samples.branch_log_probs is not None and samples.owners is not None
        args, plan, leaves = self.args, self.plan, self.plan.leaves
        stored = samples.steps.tolist()
        levels = fused_rewards(
            samples.rewards.detach().cpu().view(-1, leaves),
            plan,
            fusion=args.reward_fusion,
            branch_log_probs=samples.branch_log_probs.cpu().view(-1, leaves, len(plan.branch_steps)),
        )
        advantages = depth_advantages(levels, plan, stored, std=args.advantage_std, clip=args.advantage_clip)
        keep = samples.owners.cpu().clone()
        if args.width_pruning is not None:
            after_last = torch.tensor([j > max(plan.branch_steps) for j in stored], dtype=torch.bool)
            keep &= width_keep(advantages, after_last, leaves, args.width_pruning)
        weights = keep.float()
        total = float(weights.sum())
        samples.step_advantages = advantages
        samples.step_weights = weights * (weights.numel() / total) if total > 0 else weights

    def optimize(self, samples: Rollout) -> Metrics:
        assert isinstance(samples, TreeRollout)
        self.assign_advantages(samples)
        assert samples.step_weights is not None
        metrics = super().optimize(samples)
        metrics["tree/trained_fraction"] = float((samples.step_weights > 0).float().mean())
        return metrics

    def _replay_steps(
        self, batch: Rollout, steps: range, state: ConditionState, negative: ConditionState | None
    ) -> tuple[Tensor, StepOutput]:
        """GRPO's replay of stored ``steps``, forwarding only the rows that own their transition.

        A row that shares its transition with an owner row keeps its stored log-density and mean (ratio 1,
        KL 0, weight 0), so each transition of the tree is replayed once. Rows are step-major, as GRPO's.
        """
        assert isinstance(batch, TreeRollout) and batch.owners is not None
        assert batch.latents is not None and batch.next_latents is not None
        assert batch.log_probs is not None and batch.means is not None
        sampling, device, size = self.sampling, self.accelerator.device, len(batch)

        def step_major(values: Tensor) -> Tensor:
            return values[:, steps.start : steps.stop].transpose(0, 1).flatten(0, 1).to(device)

        owned = step_major(batch.owners).nonzero().flatten()
        rows = owned if owned.numel() else torch.zeros(1, dtype=torch.long, device=device)
        x, target = step_major(batch.latents)[rows], step_major(batch.next_latents)[rows]
        sigma = batch.sigmas[steps.start : steps.stop].repeat_interleave(size).to(device)
        sigma_next = batch.sigmas_next[steps.start : steps.stop].repeat_interleave(size).to(device)
        conditions = state.index((rows % size).tolist())
        negatives = None if negative is None else negative.index((rows % size).tolist())
        velocity = self.adapter.forward(x, sigma[rows], conditions, guidance=sampling.guidance, negative=negatives)
        out = sde_step(
            sampling.dynamics,
            velocity,
            x,
            sigma[rows],
            sigma_next[rows],
            noise_level=sampling.noise_level,
            prev_sample=target,
        )
        stored_log_prob, stored_mean = step_major(batch.log_probs).float(), step_major(batch.means).float()
        std = step_std(sampling.dynamics, sigma, sigma_next, sampling.noise_level)
        std = std.view(-1, *([1] * (stored_mean.dim() - 1)))
        full_velocity = torch.zeros(stored_mean.shape, dtype=velocity.dtype, device=device)
        if owned.numel():
            log_prob = stored_log_prob.index_put((owned,), out.log_prob)
            mean = stored_mean.index_put((owned,), out.mean)
            full_velocity = full_velocity.index_put((owned,), velocity)
        else:  # nothing to replay here: the stored values, on the graph with weight 0
            anchor = 0.0 * out.log_prob.sum()
            log_prob, mean, full_velocity = stored_log_prob + anchor, stored_mean + anchor, full_velocity + anchor
        return full_velocity, StepOutput(step_major(batch.next_latents), log_prob, mean, std)

    def policy_loss(
        self, out: StepOutput, batch: Rollout, i: int, advantages: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """PPO-clip on stored step ``i`` with each transition's depth advantage, weighted (0: shared or pruned)."""
        assert isinstance(batch, TreeRollout) and batch.step_advantages is not None and batch.step_weights is not None
        device = out.log_prob.device
        old = batch.log_probs[:, i].to(device)
        step_advantages = batch.step_advantages[:, i].to(device)
        weights = batch.step_weights[:, i].to(device)
        clip = self.args.clip_range
        ratio = torch.exp(out.log_prob - old)
        unclipped = -step_advantages * ratio
        clipped = -step_advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
        loss = (torch.maximum(unclipped, clipped) * weights).mean()
        clipped_fraction = ((ratio.detach() - 1).abs() > clip).float().mean()
        return loss, {"clip_fraction": clipped_fraction}
