"""TDM-R1: the reward-tilted target against the score it is defined by, its generator gradient by hand, a tiny
stage's three roles, exact resume, reduction to TDM at reward weight 0, and the refused configurations."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict, validate_pipeline
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.distill.distribution_matching import tdm_generator_loss
from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR, ScorePair
from flowpost.core.trainers.distill.tdm import TDMTrainer
from flowpost.core.trainers.distill.tdm_r1 import SURROGATE, TDMR1Trainer, reward_tilted_x0
from flowpost.errors import FlowpostError

SMALL = {"prompts_per_iteration": 2, "group_size": 2, "rollout_batch_size": 4, "train_batch_size": 4, "ttur": 2}
SAMPLING = {"dynamics": "ode", "steps": 2, "guidance": 1.0}
OPTIMIZERS = {GENERATOR: {"lr": 1e-3}, FAKE_SCORE: {"lr": 2e-3}, SURROGATE: {"lr": 2e-3}}
JPEG = [{"name": "jpeg_incompressibility"}]
ROLES = (GENERATOR, FAKE_SCORE, SURROGATE)


def _tdm_r1(make_trainer, out, **args):
    options = {**SMALL, "iterations": 2, **args}
    return make_trainer(out, cls=TDMR1Trainer, sampling=SAMPLING, optimizers=OPTIMIZERS, rewards=JPEG, **options)


def _x0_from_score(x, sigma, score):
    """``x = (1 - s) x0 + s eps`` has score ``-(x - (1 - s) x0) / s^2``: solved for x0."""
    return (x + sigma**2 * score) / (1 - sigma)


def _score(x, sigma, x0):
    return -(x - (1 - sigma) * x0) / sigma**2


def test_the_tilted_target_is_the_x0_of_the_tilted_score():
    """``p_real (p_surrogate / p_reference)^w`` has score ``s_real + w (s_surrogate - s_reference)``."""
    generator = torch.Generator().manual_seed(0)
    x, real, surrogate, reference = (torch.randn(3, 1, 4, 4, generator=generator) for _ in range(4))
    sigma = torch.tensor([0.2, 0.5, 0.9]).view(-1, 1, 1, 1)
    for weight in (0.0, 0.5, 3.0):
        score = _score(x, sigma, real) + weight * (_score(x, sigma, surrogate) - _score(x, sigma, reference))
        expected = _x0_from_score(x, sigma, score)
        torch.testing.assert_close(reward_tilted_x0(real, surrogate, reference, weight), expected)


def test_the_generator_gradient_is_the_tilted_score_difference_by_hand():
    generator = torch.Generator().manual_seed(1)
    x0, real, fake, surrogate, reference = (torch.randn(2, 1, 4, 4, generator=generator) for _ in range(5))
    weight = 0.7
    live = x0.clone().requires_grad_(True)
    target = reward_tilted_x0(real, surrogate, reference, weight)
    tdm_generator_loss(live, target, fake, huber_c=None).sum().backward()
    tilted_real = real + weight * (surrogate - reference)
    scale = (x0 - tilted_real).abs().flatten(1).mean(1).view(-1, 1, 1, 1)
    # the surrogate pulls x0 towards where it predicts more than the reference does
    torch.testing.assert_close(live.grad, (fake - real - weight * (surrogate - reference)) / (16 * scale))


@pytest.mark.parametrize(
    "brakes", [{}, {"dynamic_reference": False, "surrogate_kl": 1.0, "clip_range": 0.05}], ids=["ema-ref", "start-ref"]
)
def test_a_tdm_r1_stage_updates_each_role_in_its_turn(make_trainer, tmp_path, brakes):
    trainer = _tdm_r1(make_trainer, tmp_path, iterations=1, beta_dpo=100.0, **brakes)
    networks = {role: trainer.adapter.variants.module(role) for role in ROLES}
    order: list[tuple[str, tuple[bool, ...]]] = []
    step_role = trainer.step_role

    def recording(role, metrics):
        before = {r: [p.detach().clone() for p in n.parameters()] for r, n in networks.items()}
        result = step_role(role, metrics)
        changed = tuple(
            any(not torch.equal(a, b) for a, b in zip(before[r], networks[r].parameters(), strict=True)) for r in ROLES
        )
        order.append((role, changed))
        return result

    trainer.step_role = recording
    trainer.start()
    assert order == [
        (FAKE_SCORE, (False, True, False)),
        (FAKE_SCORE, (False, True, False)),
        (GENERATOR, (True, False, False)),
        (SURROGATE, (False, False, True)),
    ]
    if brakes:  # the reference is the teacher snapshot, swapped into the surrogate's network
        assert Snapshot.REFERENCE not in trainer.adapter.snapshots
        return
    reference = trainer.adapter.snapshots.state_dict(Snapshot.REFERENCE)
    surrogate = dict(networks[SURROGATE].named_parameters())
    assert all(torch.equal(reference[k], surrogate[k].detach()) for k in reference)  # decay 0 at update 0


def _role_state(trainer):
    weights = {role: trainer.adapter.variants.module(role).state_dict() for role in ROLES}
    moments = {
        role: [state["exp_avg"] for o in opt.optimizer for state in o.state.values()]
        for role, opt in trainer.roles.items()
    }
    return weights, moments


def test_a_resumed_tdm_r1_stage_matches_an_uninterrupted_one(make_trainer, tmp_path):
    settings = {"iterations": 3, "reference_decay_ramp": 0.2, "callbacks": {"ema": {"decay": 0.9}}}
    straight = _tdm_r1(make_trainer, tmp_path / "straight", resume=False, **settings)
    straight.start()
    _tdm_r1(make_trainer, tmp_path / "resumed", checkpoint_every=1, **{**settings, "iterations": 2}).start()
    resumed = _tdm_r1(make_trainer, tmp_path / "resumed", checkpoint_every=1, **settings)
    resumed.start()
    assert resumed.progress == straight.progress and resumed.progress.optimizer_step == 3
    assert resumed.roles[SURROGATE].updates == straight.roles[SURROGATE].updates == 3
    (weights_a, moments_a), (weights_b, moments_b) = _role_state(straight), _role_state(resumed)
    for role in ROLES:
        assert all(torch.equal(weights_a[role][k], weights_b[role][k]) for k in weights_a[role])
        assert len(moments_a[role]) == len(moments_b[role]) > 0
        assert all(torch.equal(a, b) for a, b in zip(moments_a[role], moments_b[role], strict=True))
    for name in (Snapshot.TEACHER, Snapshot.EMA, Snapshot.REFERENCE):
        a, b = straight.adapter.snapshots.state_dict(name), resumed.adapter.snapshots.state_dict(name)
        assert all(torch.equal(a[k], b[k]) for k in a)
    reference = straight.adapter.snapshots.state_dict(Snapshot.REFERENCE)
    live = dict(straight.adapter.variants.module(SURROGATE).named_parameters())
    assert any(not torch.equal(reference[k], live[k].detach()) for k in reference)  # it lags (decay 0.2 at 1)


def test_with_reward_weight_zero_the_generator_and_fake_score_train_as_tdm(make_trainer, tmp_path):
    r1 = _tdm_r1(make_trainer, tmp_path / "r1", reward_weight=0.0)
    r1.start()
    two_roles = {role: OPTIMIZERS[role] for role in (GENERATOR, FAKE_SCORE)}
    tdm = make_trainer(tmp_path / "tdm", cls=TDMTrainer, sampling=SAMPLING, optimizers=two_roles, iterations=2, **SMALL)
    tdm.start()
    for role in (GENERATOR, FAKE_SCORE):
        a, b = r1.adapter.variants.module(role).state_dict(), tdm.adapter.variants.module(role).state_dict()
        for key in a:  # the rows of a micro-batch come in another order: equal up to summation order,
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=2e-5)  # which Adam may lift to 1% of the lr
    start = _tdm_r1(make_trainer, tmp_path / "start", iterations=1).adapter.variants.module(GENERATOR).state_dict()
    assert any(not torch.equal(start[k], r1.adapter.variants.module(GENERATOR).state_dict()[k]) for k in start)


def _pipeline(**train):
    data = pipeline_to_dict(load_pipeline(None))
    data["stages"]["r1"] = {
        "trainer": "tdm-r1",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "sampling": {"dynamics": "ode", "steps": 4},
        "rewards": [{"name": "digit_adherence"}],
        "optimizers": {GENERATOR: {"lr": 1e-4}, FAKE_SCORE: {"lr": 2e-4}, SURROGATE: {"lr": 1e-4}},
        "train": {"iterations": 2, "prompts_per_iteration": 4, "rollout_batch_size": 16, **train},
    }
    return data


def test_configurations_it_cannot_run_are_refused_at_validate_time_with_their_path():
    validate_pipeline(_pipeline(group_size=4, train_batch_size=8))
    with pytest.raises(FlowpostError, match=r"stages\.r1\.train\.group_size.*must be >= 2"):
        validate_pipeline(_pipeline(group_size=1, train_batch_size=4))
    with pytest.raises(FlowpostError, match=r"stages\.r1\.train\.train_batch_size.*multiple of group_size"):
        validate_pipeline(_pipeline(group_size=4, train_batch_size=6))
    no_surrogate = _pipeline(group_size=4, train_batch_size=8)
    del no_surrogate["stages"]["r1"]["optimizers"][SURROGATE]
    with pytest.raises(FlowpostError, match=r"stages\.r1\.optimizers.*surrogate"):
        validate_pipeline(no_surrogate)
    no_reward = _pipeline(group_size=4, train_batch_size=8)
    del no_reward["stages"]["r1"]["rewards"]
    with pytest.raises(FlowpostError, match=r"stages\.r1"):
        validate_pipeline(no_reward)


def test_the_guided_surrogate_adds_its_guidance_to_the_target(make_trainer, tmp_path):
    """Before any update the surrogate is the teacher: ``x0_cond + w (x0_guided(g) - x0_cond)`` is the teacher's
    x0 with guidance ``1 + w (g - 1)``."""
    trainer = _tdm_r1(make_trainer, tmp_path, iterations=1, reward_weight=0.5, surrogate_guidance=3.0)
    assert trainer.null is not None  # the surrogate's guidance needs the null prompt, the teacher's does not
    prompts = [p for p in trainer.conditions.prompts if p][:2]
    state = trainer.adapter.prepare_condition_state(trainer.conditions.lookup(prompts))
    x = torch.randn(2, *trainer.adapter.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.3, 0.8])
    negative = trainer.negative_state(2)
    target = trainer.target_x0(x, sigma, state, negative)
    teacher = ScorePair(trainer.adapter, 2.0).real_x0(x, sigma, state, negative)
    torch.testing.assert_close(target, teacher, rtol=1e-4, atol=1e-5)
    unguided = ScorePair(trainer.adapter, 1.0).real_x0(x, sigma, state, None)
    assert (target - unguided).abs().mean() > 1e-3  # the guidance moved it
