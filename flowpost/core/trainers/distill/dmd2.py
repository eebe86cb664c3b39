"""DMD2: distribution matching distillation of a frozen teacher into a few-step generator.

Two trainable roles: the ``generator`` (the few-step student; it owns the base weights) and the
``fake_score`` (a flow model of the generator's current outputs). The real score is the frozen
``teacher`` snapshot with classifier-free guidance. The generator's samples, noised at a random
sigma, are pushed along ``x0_fake - x0_real``: the reverse-KL gradient between the generator's
distribution and the teacher's. Backward simulation: each micro-batch round starts from a state the
generator's own (stored, gradient-free) rollout reached at a random step; the generator's ``x0`` there
is what the fake score fits and what the generator update pushes, as in DMD2's code. No rewards.

Optional GAN term (``train.gan``): a discriminator on the fake score's middle-block features tells
noisy dataset images from noisy generator samples; its logistic loss joins the fake-score update and
the non-saturating generator loss joins the generator update.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from pydantic import Field, model_validator
from torch import Tensor

from flowpost.core.conditions import NULL_PROMPT, ConditionState
from flowpost.core.roles import RoleAdapters
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.distill.distribution_matching import (
    dmd_generator_loss,
    dmd_gradient,
    uniform_sigmas,
    x0_from_velocity,
)
from flowpost.core.trainers.distill.draws import UpdateDraws, rows_at
from flowpost.core.trainers.distill.gan import Discriminator, GANConfig, discriminator_loss, generator_gan_loss
from flowpost.core.trainers.distill.scores import (
    FAKE_SCORE,
    GENERATOR,
    DistributionMatchingArguments,
    ScorePair,
)
from flowpost.core.trainers.distill.student_states import student_states
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.matching import flow_matching_loss, noised
from flowpost.core.trainers.objective import Metrics, Objective, accumulate
from flowpost.core.trainers.rl.rollout import Rollout
from flowpost.core.trainers.role_plan import RoleUpdatePlan
from flowpost.errors import FlowpostError


class DMD2Arguments(DistributionMatchingArguments):
    """``train:`` of a DMD2 stage: pure distribution matching, plus the GAN term when ``gan`` is set. Like
    DMD2, flowpost has no regression term (DMD1's paired teacher-ODE loss)."""

    sigma_range: tuple[float, float] = Field(
        (0.02, 0.98), description="the fake-score training sigmas and the perturbation sigmas are uniform here"
    )
    gan: GANConfig | None = Field(
        None, description="the GAN term on the fake score's features (needs a dataset of images); null: off"
    )

    @model_validator(mode="after")
    def _sigmas_inside(self) -> DMD2Arguments:
        low, high = self.sigma_range
        if not 0 < low < high < 1:
            raise ValueError(f"sigma_range {self.sigma_range} must satisfy 0 < low < high < 1")
        return self


@dataclass(frozen=True)
class GeneratorPrediction:
    """The generator's gradient-free prediction on one micro-batch ``batch``: each row's stored state ``x``
    at its random step ``step`` [B] (CPU), that step's ``sigma`` [B] and ``x0 = x - sigma v``."""

    batch: Rollout
    step: Tensor
    x: Tensor
    sigma: Tensor
    x0: Tensor


class DMD2Trainer(GenerationTrainer):
    """Per micro-batch of the generator's rollout: ``ttur`` fake-score updates, then one generator update,
    all on the generator's ``x0`` at one random rollout step per sample."""

    Arguments = DMD2Arguments
    args: DMD2Arguments
    required_trainable_roles: ClassVar[tuple[str, ...]] = (GENERATOR, FAKE_SCORE)
    captured_snapshots = {Snapshot.TEACHER: None}
    keeps_rollout_states = True

    def setup(self) -> None:
        where = f"stages.{self.stage}.sampling"
        if self.sampling.dynamics != "ode" or self.sampling.window is not None:
            raise FlowpostError(
                "the few-step generator samples with the ODE over all its steps; set dynamics: ode and no window",
                where=where,
            )
        self.adapter.snapshots.capture(Snapshot.TEACHER, self.adapter.module())  # model.init is checked at load
        self.scores = ScorePair(self.adapter, self.args.real_guidance)
        self.plan = RoleUpdatePlan(((FAKE_SCORE, self.args.ttur), (GENERATOR, 1)))
        self.conditions = self.inputs.require("conditions", where=f"stages.{self.stage}.data")
        self.null = self.conditions.lookup([NULL_PROMPT]) if self.args.real_guidance != 1.0 else None
        self.gan = self.args.gan if isinstance(self.args, DMD2Arguments) else None
        self.discriminator = self.build_discriminator() if self.gan is not None else None
        self.predicted: GeneratorPrediction | None = None

    def build_discriminator(self) -> Discriminator:
        """The GAN head on the fake-score network (before the optimizers: the fake score's trains it) and
        the dataset its real images come from."""
        where = f"stages.{self.stage}.train.gan"
        variants = self.adapter.variants
        assert variants is not None  # declared before setup
        if isinstance(variants, RoleAdapters):
            raise FlowpostError(
                "the GAN head lives in the fake score's own network; train full copies (remove model.lora) "
                "or remove train.gan",
                where=where,
            )
        if self.parallel.name == "fsdp2":
            raise FlowpostError(
                "the GAN head is not sharded; use launch.backend ddp or remove train.gan",
                where=f"stages.{self.stage}.launch.backend",
            )
        demonstrations = self.inputs.demonstrations
        if demonstrations is None:
            raise FlowpostError(
                "train.gan compares generated samples with real images: name a dataset of images in data.dataset",
                where=f"stages.{self.stage}.data",
            )
        self.real = demonstrations(global_batch_size=1, seed=self.spec.seed).dataset
        network = variants.module(FAKE_SCORE)
        return Discriminator(self.scores, network, seed=self.spec.seed, where=where)

    def sample(self) -> Rollout:
        return self.generate()

    def optimize(self, samples: Rollout) -> Metrics:
        return self.train_roles_on_rollout(
            samples, self.plan, {FAKE_SCORE: self.fake_score_loss, GENERATOR: self.generator_loss}
        )

    def draws(self, batch: Rollout, tag: str) -> UpdateDraws:
        return UpdateDraws(self.spec.seed, self.stage, self.progress.rollout_iteration, batch, tag)

    def fake_score_loss(self, batch: Rollout, scale: float, tag: str) -> Objective:
        """``fake_score_objective`` (plus the weighted discriminator loss) times ``scale``, as one part."""
        loss = self.fake_score_objective(batch, tag)
        if self.gan is None:
            yield loss * scale
            return {"loss": loss.detach()}
        gan = self.discriminator_objective(batch, tag)
        total = loss + self.gan.discriminator_weight * gan
        yield total * scale
        return {"loss": total.detach(), "flow_matching": loss.detach(), "gan": gan.detach()}

    def generator_loss(self, batch: Rollout, scale: float, tag: str) -> Objective:
        """Each of ``generator_objectives`` times ``scale``, one part each; their summed value."""
        total: Metrics = {"loss": 0.0}
        for loss in self.generator_objectives(batch, tag):
            accumulate(total, {"loss": loss})
            yield loss * scale
        if self.gan is not None:  # the GAN loss reached the fake score and its head too: not theirs to keep
            self.roles[FAKE_SCORE].zero_grad(set_to_none=True)
        return total

    def negative_state(self, rows: int) -> ConditionState | None:
        """The null-prompt condition state for the teacher's guidance (None without guidance)."""
        if self.null is None:
            return None
        return self.adapter.prepare_condition_state(self.null.index([0] * rows).to(self.accelerator.device))

    def prediction(self, batch: Rollout) -> GeneratorPrediction:
        """The generator's ``x0`` on ``batch``, computed once per round (the first update to ask for it):
        the generator does not change before its own update, so every fake-score update fits, and the
        generator update pushes, this one tensor. The step is an addressed draw per sample, uniform over
        the stored steps. At the last step, while the generator is the rollout's, ``x0`` is the rollout's
        final sample."""
        if self.predicted is not None and self.predicted.batch is batch:
            return self.predicted
        device = self.accelerator.device
        states, sigmas = student_states(batch, where=f"stages.{self.stage}.sampling")
        step = self.draws(batch, "round").index("step", states.shape[1])
        x = rows_at(states, step).to(device)
        sigma = sigmas[step].to(device, x.dtype)
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        with torch.no_grad():
            x0 = x0_from_velocity(x, sigma, self.adapter.velocity(x, sigma, state))
        self.predicted = GeneratorPrediction(batch, step, x, sigma, x0)
        return self.predicted

    def fake_score_objective(self, batch: Rollout, tag: str) -> Tensor:
        """Flow matching of the fake score on the generator's detached ``x0`` (``prediction``) at fresh
        noise and sigma."""
        device = self.accelerator.device
        x0 = self.prediction(batch).x0
        draws = self.draws(batch, tag)
        noise = draws.normal("fake-noise", x0)
        sigma = uniform_sigmas(draws.uniform("fake-sigma", x0), *self.args.sigma_range)
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        return flow_matching_loss(self.scores.fake_velocity(noised(x0, noise, sigma), sigma, state), noise, x0)

    def generator_objectives(self, batch: Rollout, tag: str) -> Iterator[Tensor]:
        """The distribution-matching loss of the generator's ``x0`` (``prediction``, the one the fake score
        fitted), recomputed with gradients from the same state.

        Each yielded loss must be backpropagated before the next is asked for (the teacher swaps into
        the generator's weights in place)."""
        device = self.accelerator.device
        draws = self.draws(batch, tag)
        predicted = self.prediction(batch)
        x, sigma_k, x0 = predicted.x, predicted.sigma, predicted.x0
        state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        with torch.no_grad():  # the target first: the teacher swaps into the generator's weights
            noise = draws.normal("noise", x0)
            sigma = uniform_sigmas(draws.uniform("sigma", x0), *self.args.sigma_range)
            x_t = noised(x0, noise, sigma)
            real = self.scores.real_x0(x_t, sigma, state, self.negative_state(len(batch)))
            fake = self.scores.fake_x0(x_t, sigma, state)
            gradient = dmd_gradient(x0, real, fake)
        x0_live = x0_from_velocity(x, sigma_k, self.adapter.velocity(x, sigma_k, state))
        loss = dmd_generator_loss(x0_live, x0 - gradient).mean()
        if self.gan is not None:
            assert self.discriminator is not None
            x_gan, sigma_gan = self.gan_noised(x0_live, draws, "gan-generator")
            loss = loss + self.gan.generator_weight * generator_gan_loss(
                self.discriminator.logits(x_gan, sigma_gan, state)
            )
        yield loss
        self.predicted = None  # the round ends with this update: the generator steps next

    def gan_noised(self, x0: Tensor, draws: UpdateDraws, purpose: str) -> tuple[Tensor, Tensor]:
        """``x0`` noised at a fresh sigma in ``sigma_range`` (the diffusion GAN's input) and that sigma."""
        noise = draws.normal(f"{purpose}-noise", x0)
        sigma = uniform_sigmas(draws.uniform(f"{purpose}-sigma", x0), *self.args.sigma_range)
        return noised(x0, noise, sigma), sigma

    def real_latents(self, draws: UpdateDraws, like: Tensor) -> tuple[Tensor, ConditionState]:
        """One dataset image per row (addressed draws pick them), encoded, with its prompt's condition state."""
        rows = draws.index("gan-real", len(self.real)).tolist()
        items = [self.real[row] for row in rows]
        if "image" not in items[0]:
            raise FlowpostError(
                "the GAN term encodes the dataset's images itself; remove data.latents",
                where=f"stages.{self.stage}.data",
            )
        device = self.accelerator.device
        with torch.no_grad():
            x0 = self.adapter.encode_output_state(torch.stack([item["image"] for item in items]).to(device))
        state = self.adapter.prepare_condition_state(
            self.conditions.lookup([item["prompt"] for item in items]).to(device)
        )
        return x0.to(like.dtype), state

    def discriminator_objective(self, batch: Rollout, tag: str) -> Tensor:
        """The discriminator loss on noisy dataset images against the generator's noisy detached ``x0``
        (``prediction``)."""
        assert self.discriminator is not None
        device = self.accelerator.device
        draws = self.draws(batch, tag)
        fake = self.prediction(batch).x0
        real, real_state = self.real_latents(draws, fake)
        fake_state = self.adapter.prepare_condition_state(batch.conditions.to(device))
        real_logits = self.discriminator.logits(*self.gan_noised(real, draws, "gan-real"), real_state)
        fake_logits = self.discriminator.logits(*self.gan_noised(fake, draws, "gan-fake"), fake_state)
        return discriminator_loss(real_logits, fake_logits)
