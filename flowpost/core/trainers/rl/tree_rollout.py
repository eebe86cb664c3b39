"""Tree rollouts (BranchGRPO): one root per prompt, every node advanced once per step, split at branch steps.

A tree of ``L = factor ** len(branch_steps)`` leaves shares each prefix: entering step ``j`` it holds
``width(j) = factor ** (branch steps before j)`` nodes, so one tree costs ``sum_j width(j)`` forward rows
against ``L * steps`` for ``L`` independent trajectories. Leaves are the group's samples; leaf ``l``'s node
after step ``j`` is ``l // (L / width(j + 1))``. Noise is addressed like the flat engine's: a node's step-``j``
noise is the one flat GRPO draws for its first leaf's global sample index, the root's initial noise its
first leaf's, so a resumed iteration redraws the same tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.noise import addressed_randn
from flowpost.core.sampling.ode import euler_step
from flowpost.core.sampling.sde import sde_step
from flowpost.core.trainers.rl.rollout import Rollout

if TYPE_CHECKING:
    from flowpost.core.trainers.rollout_engine import RolloutEngine


@dataclass(frozen=True)
class TreePlan:
    """The shape of every tree: ``steps`` sampler steps, a ``factor``-way split at each of ``branch_steps``."""

    steps: int
    branch_steps: tuple[int, ...]
    factor: int

    @property
    def leaves(self) -> int:
        return self.factor ** len(self.branch_steps)

    def width(self, j: int) -> int:
        """Nodes entering step ``j`` (``width(steps)``: the leaves)."""
        return self.factor ** sum(1 for b in self.branch_steps if b < j)

    def node_after(self, leaf: Tensor | int, j: int) -> Tensor | int:
        """The node leaf ``leaf`` passes through after step ``j`` (index among ``width(j + 1)`` nodes)."""
        return leaf // (self.leaves // self.width(j + 1))

    def forward_rows(self) -> int:
        """Model rows (per-sample forward evaluations) one tree costs."""
        return sum(self.width(j) for j in range(self.steps))


@dataclass
class TreeRollout(Rollout):
    """A rollout of tree leaves (rows, tree-major: ``leaves`` rows per group), with their paths' stored steps.

    Each leaf row holds its whole path, so a transition shared by several leaves is stored once per leaf;
    ``owners[b, i]`` marks the one row (the node's first leaf) that trains it. ``nodes[b, i]`` is the node
    after stored step ``i``; ``branch_log_probs[b, k]`` the log-density of the edge into row ``b``'s node at
    branch ``k``. ``step_advantages`` and ``step_weights`` are set before training.
    """

    nodes: Tensor | None = None
    owners: Tensor | None = None
    branch_log_probs: Tensor | None = None
    step_advantages: Tensor | None = None
    step_weights: Tensor | None = None


def _node_noise(engine: RolloutEngine, plan: TreePlan, first: list[int], width: int, j: int, iteration: int) -> Tensor:
    """Step ``j``'s noise of ``width`` nodes per tree, addressed by each node's first leaf (``first``: trees)."""
    span = plan.leaves // width
    indices = [f + n * span for f in first for n in range(width)]
    return addressed_randn(
        engine.adapter.latent_shape,
        indices=indices,
        purpose=f"step-{j}",
        seed=engine.seed,
        stage=engine.stage,
        step=iteration,
    )


@torch.no_grad()
def generate_tree(
    engine: RolloutEngine,
    plan: TreePlan,
    iteration: int,
    *,
    sde_steps: set[int],
    stored_steps: list[int],
    branch_noise_scale: float = 1.0,
) -> TreeRollout:
    """This rank's trees of ``iteration`` (whole groups), SDE at ``sde_steps`` and every branch step.

    ``stored_steps`` (a subset of the SDE steps) are kept for replay. A branch child's noise is multiplied
    by ``branch_noise_scale``; its log-density stays the sampler's transition's.
    """
    args, sampling, adapter = engine.args, engine.sampling, engine.adapter
    share = engine.rank_share(iteration)
    groups, indices, prompts, metadata = share.plan, share.indices, share.prompts, share.metadata
    leaves = plan.leaves
    sigmas = adapter.inference_sigmas(sampling.steps)
    batch, null = share.conditions, share.null
    trees = len(indices) // leaves
    per_batch = max(1, max(args.rollout_batch_size // engine.accelerator.num_processes, 1) // leaves)
    parts = []
    for start in range(0, trees, per_batch):
        chunk = list(range(start, min(start + per_batch, trees)))
        parts.append(
            _grow(
                engine,
                plan,
                iteration,
                chunk,
                indices,
                batch,
                null,
                sigmas,
                sde_steps,
                stored_steps,
                branch_noise_scale,
            )
        )
    stored = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
    steps = torch.tensor(stored_steps, dtype=torch.long)
    leaf = torch.arange(len(indices)) % leaves
    nodes = torch.stack([torch.as_tensor(plan.node_after(leaf, j)) for j in stored_steps], 1).long()
    span = torch.tensor([leaves // plan.width(j + 1) for j in stored_steps], dtype=torch.long)
    return TreeRollout(
        prompts=prompts,
        metadata=metadata,
        group_ids=torch.tensor([groups.group_ids[k] for k in indices]),
        indices=torch.tensor(indices),
        conditions=batch,
        steps=steps,
        sigmas=sigmas[steps],
        sigmas_next=sigmas[steps + 1],
        nodes=nodes.reshape(len(indices), len(stored_steps)),
        owners=(leaf[:, None] % span[None, :] == 0).reshape(len(indices), len(stored_steps)),
        **stored,
    )


def _grow(
    engine: RolloutEngine,
    plan: TreePlan,
    iteration: int,
    trees: list[int],
    indices: list[int],
    batch: ConditionBatch,
    null: ConditionBatch | None,
    sigmas: Tensor,
    sde_steps: set[int],
    stored_steps: list[int],
    scale: float,
) -> dict[str, Tensor]:
    """Sample the trees ``trees`` (rank-local tree numbers) together; per-leaf stored transitions and finals."""
    adapter, sampling, device, leaves = engine.adapter, engine.sampling, engine.accelerator.device, plan.leaves
    first = [indices[t * leaves] for t in trees]
    address = {"seed": engine.seed, "stage": engine.stage, "step": iteration}
    x = addressed_randn(adapter.latent_shape, indices=first, purpose="initial", **address).to(device)
    states: dict[int, tuple[ConditionState, ConditionState | None]] = {}
    stored: dict[str, list[Tensor]] = {"latents": [], "next_latents": [], "log_probs": [], "means": []}
    branch_log_probs: list[Tensor] = []
    leaf = torch.arange(leaves, device=device)
    tree_rows = torch.arange(len(trees), device=device)[:, None]
    for j in range(len(sigmas) - 1):
        width = plan.width(j)
        if width not in states:
            rows = [t * leaves for t in trees for _ in range(width)]
            negative = adapter.prepare_condition_state(null.index([0] * len(rows))) if null is not None else None
            states[width] = (adapter.prepare_condition_state(batch.index(rows)), negative)
        state, negative = states[width]
        velocity = adapter.forward(x, sigmas[j], state, guidance=sampling.guidance, negative=negative)
        branch = j in plan.branch_steps
        if branch or j in sde_steps:
            after = plan.width(j + 1)
            noise = _node_noise(engine, plan, first, after, j, iteration).to(device)
            if branch:
                noise = noise * scale
                velocity = velocity.repeat_interleave(plan.factor, 0)
                x_in = x.repeat_interleave(plan.factor, 0)
            else:
                x_in = x
            out = sde_step(
                sampling.dynamics,
                velocity,
                x_in,
                sigmas[j],
                sigmas[j + 1],
                noise_level=sampling.noise_level,
                noise=noise,
            )
            # rows of a leaf's node before and after the step
            before = (tree_rows * width + leaf[None, :] // (leaves // width)).flatten()
            below = (tree_rows * after + leaf[None, :] // (leaves // after)).flatten()
            if branch:
                branch_log_probs.append(out.log_prob[below])
            if j in stored_steps:
                stored["latents"].append(x[before])
                stored["next_latents"].append(out.prev_sample[below])
                stored["log_probs"].append(out.log_prob[below])
                stored["means"].append(out.mean[below])
            x = out.prev_sample
        else:
            x = euler_step(velocity, x, sigmas[j], sigmas[j + 1])
    result = {key: torch.stack(values, dim=1) for key, values in stored.items() if values}
    result["branch_log_probs"] = torch.stack(branch_log_probs, dim=1)
    result["final"] = x
    return result
