"""DMD2's GAN term: the discriminator head on the fake score's features, its losses, checkpoint and resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from one_device import OneDevice, rollout_on

from flowpost.core.checkpoint import latest_checkpoint, load_checkpoint
from flowpost.core.io import sha256_file, write_json_atomic
from flowpost.core.trainers.distill.dmd2 import DMD2Trainer
from flowpost.core.trainers.distill.gan import HEAD_NAME, discriminator_loss, generator_gan_loss
from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR
from flowpost.errors import FlowpostError

SMALL = {"prompts_per_iteration": 4, "group_size": 1, "rollout_batch_size": 4, "train_batch_size": 4}
SAMPLING = {"dynamics": "ode", "steps": 2, "guidance": 1.0}
OPTIMIZERS = {GENERATOR: {"lr": 1e-3}, FAKE_SCORE: {"lr": 2e-3}}
GAN = {"generator_weight": 0.5, "discriminator_weight": 1.0}


def _dmd2(make_trainer, out, sampling=SAMPLING, **args):
    options = {**SMALL, "iterations": 2, "ttur": 2, **args}
    return make_trainer(out, cls=DMD2Trainer, sampling=sampling, optimizers=OPTIMIZERS, **options)


def _head(trainer):
    return getattr(trainer.adapter.variants.module(FAKE_SCORE), HEAD_NAME)


def _weights(trainer):
    return {key: value.clone() for key, value in trainer.adapter.trainable_network().state_dict().items()}


def test_the_gan_losses_are_the_logistic_losses_of_their_logits():
    real, fake = torch.tensor([2.0, -1.0]), torch.tensor([0.5, 3.0])
    expected = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(1.0))) / 2
    expected += (math.log1p(math.exp(0.5)) + math.log1p(math.exp(3.0))) / 2
    assert discriminator_loss(real, fake).item() == pytest.approx(expected, rel=1e-6)
    generator = (math.log1p(math.exp(-0.5)) + math.log1p(math.exp(-3.0))) / 2
    assert generator_gan_loss(fake).item() == pytest.approx(generator, rel=1e-6)


def test_without_gan_training_is_bit_identical_to_a_gan_of_zero_weights(make_trainer, tmp_path):
    off = _dmd2(make_trainer, tmp_path / "off")
    off.start()
    zero = _dmd2(make_trainer, tmp_path / "zero", gan={"generator_weight": 0.0, "discriminator_weight": 0.0})
    head = {key: value.clone() for key, value in _head(zero).state_dict().items()}
    zero.start()
    assert off.discriminator is None and not hasattr(off.adapter.variants.module(FAKE_SCORE), HEAD_NAME)
    trained, zeroed = _weights(off), _weights(zero)
    assert set(zeroed) - set(trained) == {f"{FAKE_SCORE}.{HEAD_NAME}.{key}" for key in head}
    assert all(torch.equal(trained[key], zeroed[key]) for key in trained)
    assert all(torch.equal(head[key], value) for key, value in _head(zero).state_dict().items())  # no gradient
    for name in off.adapter.snapshots.names():
        a, b = off.adapter.snapshots.state_dict(name), zero.adapter.snapshots.state_dict(name)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_one_iteration_with_gan_trains_the_head_with_the_fake_scores_optimizer(make_trainer, tmp_path):
    trainer = _dmd2(make_trainer, tmp_path, iterations=1, gan=GAN)
    head = _head(trainer)
    owned = {id(p) for o in trainer.roles[FAKE_SCORE].optimizer for g in o.param_groups for p in g["params"]}
    assert {id(p) for p in head.parameters()} <= owned
    generator_owned = {id(p) for o in trainer.roles[GENERATOR].optimizer for g in o.param_groups for p in g["params"]}
    assert not {id(p) for p in head.parameters()} & generator_owned
    before = [p.detach().clone() for p in head.parameters()]
    trainer.start()
    assert all(not torch.equal(b, p.detach()) for b, p in zip(before, head.parameters(), strict=True))


def test_the_discriminator_loss_of_a_fixed_head_is_the_formula_on_its_logits(make_trainer, tmp_path):
    trainer = _dmd2(make_trainer, tmp_path, gan=GAN)
    last = _head(trainer).layers[-1]
    with torch.no_grad():  # every logit is the bias
        last.weight.zero_()
        last.bias.fill_(0.7)
    batch = trainer.generate()
    loss = trainer.discriminator_objective(batch, "0-0")
    b = torch.tensor(0.7)
    assert loss.item() == pytest.approx((F.softplus(-b) + F.softplus(b)).item(), rel=1e-6)
    assert loss.dtype == torch.float32 and loss.dim() == 0


def test_the_generator_receives_the_gan_gradient_and_the_fake_score_keeps_none_of_it(make_trainer, tmp_path):
    values, gradients = [], []
    for weight in (0.0, 1.0):
        trainer = _dmd2(make_trainer, tmp_path / str(weight), gan={**GAN, "generator_weight": weight})
        batch = trainer.generate()
        values.append(float(trainer.backpropagate(trainer.generator_loss(batch, 1.0, "0-2"))["loss"]))
        generator = trainer.adapter.variants.module(GENERATOR)
        gradients.append(torch.cat([p.grad.flatten() for p in generator.parameters() if p.grad is not None]))
        fake = trainer.adapter.variants.module(FAKE_SCORE)
        assert all(p.grad is None for p in fake.parameters())
    assert values[0] != values[1]
    assert not torch.equal(gradients[0], gradients[1])


def test_the_head_is_checkpointed_and_a_resumed_gan_stage_matches_an_uninterrupted_one(make_trainer, tmp_path):
    straight = _dmd2(make_trainer, tmp_path / "straight", resume=False, gan=GAN)
    straight.start()
    _dmd2(make_trainer, tmp_path / "resumed", checkpoint_every=1, gan=GAN, iterations=1).start()
    state = load_checkpoint(latest_checkpoint(tmp_path / "resumed" / "checkpoints"), verified=True)
    head_keys = {key for key in state.model if key.startswith(f"{FAKE_SCORE}.{HEAD_NAME}.")}
    assert head_keys and head_keys <= set(state.roles[FAKE_SCORE]["optimizer"]["state"])
    resumed = _dmd2(make_trainer, tmp_path / "resumed", checkpoint_every=1, gan=GAN)
    resumed.start()
    assert resumed.progress == straight.progress and resumed.progress.optimizer_step == 2
    a, b = _weights(straight), _weights(resumed)
    assert set(a) == set(b) and all(torch.equal(a[key], b[key]) for key in a)
    moments = [
        [s["exp_avg"] for o in trainer.roles[FAKE_SCORE].optimizer for s in o.state.values()]
        for trainer in (straight, resumed)
    ]
    assert len(moments[0]) == len(moments[1]) > 0
    assert all(torch.equal(x, y) for x, y in zip(*moments, strict=True))


def test_gan_on_lora_roles_is_refused_naming_the_config_path(make_trainer, tmp_path):
    with pytest.raises(FlowpostError, match=r"stages\.sft\.train\.gan.*remove model\.lora|remove model\.lora"):
        _dmd2(make_trainer, tmp_path, gan=GAN, lora_rank=4)


def test_the_gan_terms_run_on_the_latents_device(make_trainer, tmp_path):
    meta = torch.device("meta")
    trainer = _dmd2(make_trainer, tmp_path, gan=GAN)
    rollout = trainer.generate()
    on_meta = rollout_on(trainer, rollout, meta)  # the head moves with the fake score's network
    with OneDevice():
        losses = [trainer.discriminator_objective(on_meta, "0-0"), *trainer.generator_objectives(on_meta, "0-1")]
    assert all(loss.device == meta and loss.dtype == torch.float32 and loss.dim() == 0 for loss in losses)


def test_gan_without_dataset_images_is_refused_naming_the_data_section(make_trainer, data_dirs, tmp_path):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    rows = "".join(json.dumps({"prompt": f"digit {i}", "metadata": {"label": i}}) + "\n" for i in range(10))
    (prompts / "prompts.jsonl").write_text(rows, encoding="utf-8")
    write_json_atomic(prompts / "manifest.json", {"sha256": sha256_file(prompts / "prompts.jsonl")})
    dirs = (prompts, data_dirs[1])
    _dmd2(make_trainer, tmp_path / "off", dirs=dirs)  # the prompts are enough without the GAN term
    with pytest.raises(FlowpostError, match=r"stages\.sft\.data.*dataset of images"):
        _dmd2(make_trainer, tmp_path / "on", dirs=dirs, gan=GAN)


def test_with_several_steps_the_discriminator_sees_as_fakes_the_x0_the_generator_is_pushed_on(
    make_trainer, tmp_path, monkeypatch
):
    trainer = _dmd2(make_trainer, tmp_path, sampling={**SAMPLING, "steps": 3}, gan=GAN, train_batch_size=2)
    seen: list[tuple[str, torch.Tensor]] = []
    noised = trainer.gan_noised

    def recording(x0, draws, purpose):
        seen.append((purpose, x0.detach().clone()))
        return noised(x0, draws, purpose)

    monkeypatch.setattr(trainer, "gan_noised", recording)
    finals = []
    objective = trainer.discriminator_objective

    def discriminator_objective(batch, tag):
        finals.append(batch.final.clone())
        return objective(batch, tag)

    monkeypatch.setattr(trainer, "discriminator_objective", discriminator_objective)
    trainer.start()
    fakes = [x0 for purpose, x0 in seen if purpose == "gan-fake"]
    pushed = [x0 for purpose, x0 in seen if purpose == "gan-generator"]
    assert len(fakes) == 2 * len(pushed) == 8  # ttur 2, 2 micro-batches in each of 2 iterations
    for number, live in enumerate(pushed):
        assert all(torch.equal(fake, live) for fake in fakes[2 * number : 2 * number + 2])
    assert any(not torch.equal(live, final) for live, final in zip(pushed, finals[::2], strict=True))
