"""BranchGRPO: the tree's shape and shared prefixes, fused rewards and depth advantages, pruning, the replay
ratio, exact resume."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.trainers.rl.branchgrpo import (
    BranchGRPOArguments,
    BranchGRPOTrainer,
    depth_advantages,
    fused_rewards,
    pruned_steps,
    width_keep,
)
from flowpost.core.trainers.rl.tree_rollout import TreePlan
from flowpost.errors import FlowpostError

JPEG = [{"name": "jpeg_incompressibility"}]
# 2 trees of 4 leaves, split at steps 0 and 2 of 6: entering steps 0..5 a tree holds 1, 2, 2, 4, 4, 4 nodes
TREE = {
    "prompts_per_iteration": 2,
    "group_size": 4,
    "branch_steps": [0, 2],
    "rollout_batch_size": 8,
    "train_batch_size": 4,
}
PLAN = TreePlan(steps=6, branch_steps=(0, 2), factor=2)


def _count_rows(trainer) -> list[int]:
    """Rows of every model call the trainer's adapter makes from now on."""
    calls: list[int] = []
    forward = trainer.adapter.forward

    def counted(x, *args, **kwargs):
        calls.append(x.shape[0])
        return forward(x, *args, **kwargs)

    trainer.adapter.forward = counted
    return calls


def test_a_tree_rollout_shares_prefixes_and_costs_its_node_count(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=BranchGRPOTrainer, rewards=JPEG, sampling={"steps": 6}, **TREE)
    calls = _count_rows(trainer)
    rollout = trainer.sample()
    assert sum(calls) == 2 * PLAN.forward_rows() == 2 * 17 < 8 * 6  # flat GRPO: 8 samples x 6 steps
    assert rollout.final.shape[0] == len(rollout) == 8 and rollout.steps.tolist() == [0, 1, 2, 3, 4]
    assert rollout.group_ids.tolist() == [0] * 4 + [1] * 4
    x, nxt = rollout.latents, rollout.next_latents
    for tree in (0, 4):
        a, b, c = tree, tree + 1, tree + 2  # a, b share a node until the split at step 2; c leaves at step 0
        assert torch.equal(x[a, 0], x[c, 0])  # one root
        assert not torch.equal(nxt[a, 0], nxt[c, 0])  # split at step 0
        assert torch.equal(nxt[a, 1], nxt[b, 1]) and torch.equal(x[a, 2], x[b, 2])  # shared until step 2
        assert not torch.equal(nxt[a, 2], nxt[b, 2])  # split at step 2
        assert torch.equal(rollout.log_probs[a, :2], rollout.log_probs[b, :2])
    assert not torch.equal(x[0, 0], x[4, 0])  # trees start from their own noise
    # one owner per node: 1 root edge pair... nodes after steps 0..4 are 2, 2, 4, 4, 4 per tree
    assert rollout.owners.sum(0).tolist() == [4, 4, 8, 8, 8]
    assert rollout.nodes[:4].tolist() == [[0, 0, 0, 0, 0], [0, 0, 1, 1, 1], [1, 1, 2, 2, 2], [1, 1, 3, 3, 3]]


def test_the_same_iteration_redraws_the_same_tree(make_trainer, tmp_path):
    settings = {"rewards": JPEG, "sampling": {"steps": 6}, **TREE}
    first = make_trainer(tmp_path / "a", cls=BranchGRPOTrainer, **settings).sample()
    again = make_trainer(tmp_path / "b", cls=BranchGRPOTrainer, **{**settings, "rollout_batch_size": 4}).sample()
    torch.testing.assert_close(first.final, again.final)  # forward batching changes nothing
    torch.testing.assert_close(first.log_probs, again.log_probs)


def _direct_levels(rewards: list[float], edge: dict[tuple[int, int], float], fusion: str) -> dict[int, list[float]]:
    """Node rewards of one 2-branch, factor-2 tree by walking it: level -> nodes."""
    import math

    levels = {2: rewards}
    for level in (1, 0):
        below = levels[level + 1]
        nodes = []
        for n in range(2**level):
            kids = [2 * n, 2 * n + 1]
            if fusion == "mean":
                span = 4 // 2**level
                nodes.append(sum(rewards[n * span : (n + 1) * span]) / span)
            else:
                w = [math.exp(edge[(level, k)]) for k in kids]
                nodes.append(sum(wi * below[k] for wi, k in zip(w, kids, strict=True)) / sum(w))
        levels[level] = nodes
    return levels


@pytest.mark.parametrize("fusion", ["mean", "path-weighted"])
def test_fused_rewards_and_depth_advantages_match_a_direct_computation(fusion):
    rewards = [0.1, 0.7, 0.4, 0.2]
    # edge log-density into each node, by (branch, child node); a leaf carries its path's edges
    edge = {(0, 0): -0.3, (0, 1): 0.5, (1, 0): 0.2, (1, 1): -1.0, (1, 2): 0.0, (1, 3): 0.9}
    branch_log_probs = torch.tensor([[[edge[(0, leaf // 2)], edge[(1, leaf)]] for leaf in range(4)]])
    levels = fused_rewards(torch.tensor([rewards]), PLAN, fusion=fusion, branch_log_probs=branch_log_probs)
    direct = _direct_levels(rewards, edge, fusion)
    for level in range(3):
        assert levels[level][0].tolist() == pytest.approx(direct[level])
    advantages = depth_advantages(levels, PLAN, [0, 1, 2, 3], clip=None)
    for column, level in enumerate([1, 1, 2, 2]):  # the node after steps 0, 1 is at level 1; after 2, 3 level 2
        values = torch.tensor(direct[level], dtype=torch.float64)
        normalised = (values - values.mean()) / (values.std(correction=0) + 1e-4)
        per_leaf = normalised[torch.arange(4) // (4 // len(values))]
        assert advantages[:, column].tolist() == pytest.approx(per_leaf.tolist(), rel=1e-5)


def test_a_lone_node_has_no_advantage():
    plan = TreePlan(steps=6, branch_steps=(2,), factor=2)
    levels = fused_rewards(torch.tensor([[1.0, 0.0]]), plan, fusion="mean")
    advantages = depth_advantages(levels, plan, [0, 1, 2, 3])
    assert advantages[:, :2].abs().sum() == 0 and advantages[:, 2:].abs().sum() > 0


def test_width_pruning_keeps_the_extremes_after_the_last_branch_in_each_tree():
    advantages = torch.tensor([[0.0, 5.0, 1.0], [0.0, -2.0, 3.0], [0.0, 0.5, -4.0], [0.0, 2.0, 0.1]] * 2)
    advantages[4:] *= -1  # the second tree: the order reversed
    after_last = torch.tensor([False, True, True])
    keep = width_keep(advantages, after_last, leaves=4, fraction=0.5)  # 8 transitions per tree: keep 2 + 2
    assert keep[:, 0].all()  # before the last branch: untouched
    assert keep[:4, 1:].flatten().tolist() == [True, False, True, True, False, True, False, False]
    assert keep[4:, 1:].flatten().tolist() == [True, False, True, True, False, True, False, False]


def test_depth_pruning_slides_earlier_and_stops_at_the_last_branch():
    assert pruned_steps([6, 7], 5, every=0, last_branch=2) == {6, 7}
    assert pruned_steps([6, 7], 3, every=2, last_branch=2) == {5, 6}
    assert pruned_steps([6, 7], 100, every=2, last_branch=2) == {2, 3}


def test_pruning_trains_fewer_transitions_and_skips_pruned_steps(make_trainer, tmp_path):
    trainer = make_trainer(
        tmp_path,
        cls=BranchGRPOTrainer,
        rewards=JPEG,
        sampling={"steps": 6},
        depth_pruning=[4],
        width_pruning=0.5,
        **TREE,
    )
    rollout = trainer.sample()
    assert rollout.steps.tolist() == [0, 1, 2, 3]  # step 4 is sampled but not stored
    trainer.rollouts.score(rollout)
    trainer.assign_advantages(rollout)
    trained = rollout.step_weights > 0
    # after the last branch (step 2) only step 3 remains: 4 leaves a tree, the best and the worst train
    assert trained.sum(0).tolist() == [4, 4, 8, 4]
    assert float(rollout.step_weights.mean()) == pytest.approx(1.0)


@pytest.mark.parametrize("guidance", [1.0, 3.0])
@pytest.mark.parametrize("reward_fusion", ["mean", "path-weighted"])
def test_replay_ratio_is_one_before_any_update(make_trainer, tmp_path, guidance, reward_fusion):
    from flowpost.core.diagnostics import check_consistency

    trainer = make_trainer(
        tmp_path,
        cls=BranchGRPOTrainer,
        rewards=JPEG,
        sampling={"steps": 6, "guidance": guidance},
        reward_fusion=reward_fusion,
        branch_noise_scale=2.0,
        **TREE,
    )
    report = check_consistency(trainer)
    assert report["ok"] and report["max_abs_ratio_error"] < 1e-5 and report["steps"] == [0, 1, 2, 3, 4]


def test_a_branchgrpo_stage_trains_and_resumes_to_identical_weights(make_trainer, tmp_path, fresh_weights):
    settings = {
        "rewards": JPEG,
        "sampling": {"steps": 6},
        "iterations": 3,
        "kl_beta": 0.1,
        "lr": 1e-3,
        "depth_pruning": [4],
        "depth_pruning_slide_every": 1,
        **TREE,
    }
    straight = make_trainer(tmp_path / "straight", cls=BranchGRPOTrainer, resume=False, **settings)
    progress = straight.start()
    assert progress.rollout_iteration == 3
    weights = straight.adapter.module().state_dict()
    assert any(not torch.equal(weights[k], fresh_weights[k]) for k in weights)
    first = make_trainer(
        tmp_path / "resumed", cls=BranchGRPOTrainer, checkpoint_every=1, **{**settings, "iterations": 2}
    )
    first.start()
    resumed = make_trainer(tmp_path / "resumed", cls=BranchGRPOTrainer, checkpoint_every=1, **settings)
    resumed.start()
    b = resumed.adapter.module().state_dict()
    assert all(torch.equal(weights[k], b[k]) for k in weights)


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"group_size": 4}, "group_size 4 must equal branching_factor \\*\\* len\\(branch_steps\\) = 8"),
        ({"branch_steps": [3, 1], "group_size": 4}, "distinct, increasing"),
        ({"zero_advantage": "drop"}, "use keep"),
    ],
)
def test_bad_tree_arguments_are_refused(train, message):
    with pytest.raises(ValueError, match=message):
        BranchGRPOArguments.model_validate(train)


def test_a_branch_step_past_the_sampler_steps_names_its_config_path(make_trainer, tmp_path):
    with pytest.raises(FlowpostError, match="past the last trainable step 4") as error:
        make_trainer(
            tmp_path, cls=BranchGRPOTrainer, rewards=JPEG, sampling={"steps": 6}, **{**TREE, "branch_steps": [0, 5]}
        )
    assert error.value.where == "stages.sft.train.branch_steps"


@pytest.mark.parametrize("per_pass", [0, 1])
def test_replaying_each_shared_transition_once_gives_the_full_replays_gradient(make_trainer, tmp_path, per_pass):
    from functools import partial

    from flowpost.core.trainers.objective import to_host
    from flowpost.core.trainers.rl.grpo import GRPOTrainer

    trainer = make_trainer(
        tmp_path, cls=BranchGRPOTrainer, rewards=JPEG, sampling={"steps": 6}, replay_steps_per_pass=per_pass, **TREE
    )
    rollout = trainer.sample()
    trainer.rollouts.score(rollout)
    trainer.assign_advantages(rollout)
    batch = rollout.select([0, 1, 5, 6])
    grads, losses = [], []
    for replay in (None, partial(GRPOTrainer._replay_steps, trainer)):  # owners only, then every row
        if replay is not None:
            trainer._replay_steps = replay
        calls = _count_rows(trainer)
        trainer.adapter.module().zero_grad()
        losses.append(to_host(trainer.backpropagate(trainer.replay_loss(batch, scale=1.0)))[0]["loss"])
        grads.append(torch.cat([p.grad.flatten() for p in trainer.adapter.module().parameters() if p.grad is not None]))
        if replay is None:
            assert sum(calls) == int(batch.owners.sum()) < 4 * 5
    assert float(grads[0].abs().max()) > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-8)


def test_the_example_validates_and_a_wrong_group_size_names_the_train_section():
    from pathlib import Path

    import yaml

    from flowpost.core.config.loading import validate_pipeline

    example = Path(__file__).parents[3] / "examples" / "digits-branchgrpo.yaml"
    data = yaml.safe_load(example.read_text())
    assert validate_pipeline(data, source="example").stages["branchgrpo"].train["branch_steps"] == [0, 3, 6]
    data["stages"]["branchgrpo"]["train"]["group_size"] = 4
    with pytest.raises(FlowpostError, match="stages.branchgrpo.train: group_size 4 must equal"):
        validate_pipeline(data, source="example")
