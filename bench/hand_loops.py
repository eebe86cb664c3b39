"""Minimal hand-written torch loops doing a stage's math on the stage's own model and data.

The baselines of ``core_overhead.py`` and ``condition_cache.py``: the same network (built from the
same spec and seed), the same batch sizes, loss, optimizer, clipping, warm-up, EMA and reward, with
none of flowpost's trainer around them (no callbacks, events, addressed noise, bad-step checks,
rollout engine or layouts). Noise comes from one seeded generator.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from flowpost.core.conditions import NULL_PROMPT, ConditionBatch
from flowpost.core.config.schema import StageConfig
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.stage_inputs import load_stage_inputs
from flowpost.stage import build_adapter, build_rewards

Encode = Callable[[list[str]], ConditionBatch]
HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)


def _velocity(net: torch.nn.Module, x: Tensor, sigma: Tensor, cond: ConditionBatch) -> Tensor:
    states = cond.token_states * cond.token_mask.to(cond.token_states.dtype).unsqueeze(-1)
    timestep = (sigma * 1000.0).to(x.dtype).expand(x.shape[0])
    return net(hidden_states=x, encoder_hidden_states=states, pooled_projections=cond.pooled, timestep=timestep)[0]


def flow_sde_transition(
    v: Tensor, x: Tensor, sigma: Tensor, sigma_next: Tensor, noise_level: float
) -> tuple[Tensor, Tensor]:
    """Mean and std of Flow-GRPO's SDE step ``sigma -> sigma_next`` (per-row sigmas [B], images [B, C, H, W])."""
    s = sigma.view(-1, 1, 1, 1)
    sn = sigma_next.view(-1, 1, 1, 1)
    g = noise_level * torch.sqrt(s / torch.where(s >= 1.0, 1.0 - sn, 1.0 - s))
    mean = x + (sn - s) * (v + g**2 / (2.0 * s) * (x + (1.0 - s) * v))
    return mean, g * torch.sqrt(s - sn)


def log_prob(value: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Per-row mean of the elementwise normal log-density."""
    return (-((value - mean) ** 2) / (2.0 * std**2) - torch.log(std) - HALF_LOG_TWO_PI).flatten(1).mean(1)


class _Optimised:
    """AdamW with linear warm-up and a warm-up-scheduled EMA of the trainable weights."""

    def __init__(self, net: torch.nn.Module, train: dict[str, Any], ema_decay: float | None) -> None:
        self.params = [p for p in net.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=train["lr"], betas=tuple(train["adam_betas"]), weight_decay=train["weight_decay"]
        )
        warmup = train["warmup_steps"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.ema_decay = ema_decay
        self.ema = [p.detach().clone() for p in self.params] if ema_decay else []
        self.steps = 0

    def step(self, max_norm: float | None = None) -> None:
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        if self.ema_decay:
            decay = min(self.ema_decay, (1.0 + self.steps) / (10.0 + self.steps))
            with torch.no_grad():
                for average, param in zip(self.ema, self.params, strict=True):
                    average.lerp_(param.detach(), 1.0 - decay)


class HandSFT:
    """Flow matching with logit-normal sigmas and caption dropout, one optimizer step per batch.

    ``encode`` gives the conditions of a batch's prompts: the cached table by default, or an
    encoder called every step.
    """

    def __init__(self, spec: StageSpec, *, encode: Encode | None = None) -> None:
        stage = StageConfig.model_validate(spec.config)
        self.train = stage.train
        self.net = build_adapter(stage, spec).module()
        self.net.train()
        inputs = load_stage_inputs(spec)
        self.encode = encode or inputs.conditions.lookup
        loader = inputs.demonstrations(global_batch_size=self.train["batch_size"], seed=spec.seed, rank=0, world_size=1)
        images, self.prompts = [], []
        for batch in loader.iter_epoch(0):
            images.append(batch["image"])
            self.prompts += batch["prompt"]
        self.images = torch.cat(images)
        clip = stage.callbacks.grad_clip
        self.max_norm = clip.max_norm if clip else None
        self.opt = _Optimised(self.net, self.train, stage.callbacks.ema.decay if stage.callbacks.ema else None)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.order: list[int] = []

    def _rows(self, size: int) -> list[int]:
        if len(self.order) < size:
            self.order = torch.randperm(len(self.images), generator=self.generator).tolist()
        rows, self.order = self.order[:size], self.order[size:]
        return rows

    def step(self) -> float:
        """One optimizer step; returns its loss."""
        train, g = self.train, self.generator
        rows = self._rows(train["batch_size"])
        x0 = self.images[rows] * 2.0 - 1.0
        n = x0.shape[0]
        noise = torch.randn(x0.shape, generator=g)
        sigma = torch.sigmoid(train["logit_mean"] + train["logit_std"] * torch.randn(n, generator=g))
        dropped = (torch.rand(n, generator=g) < train["cfg_dropout"]).tolist()
        prompts = [NULL_PROMPT if drop else self.prompts[r] for r, drop in zip(rows, dropped, strict=True)]
        s = sigma.view(-1, 1, 1, 1)
        velocity = _velocity(self.net, (1.0 - s) * x0 + s * noise, sigma, self.encode(prompts))
        loss = (velocity - (noise - x0)).pow(2).mean()
        loss.backward()
        self.opt.step(self.max_norm)
        return float(loss.detach())

    def timed(self, steps: int) -> list[float]:
        """Seconds of each of ``steps`` steps after a first, untimed one."""
        self.step()
        seconds = []
        for _ in range(steps - 1):
            start = time.perf_counter()
            self.step()
            seconds.append(time.perf_counter() - start)
        return seconds


class HandGRPO:
    """Flow-GRPO: K-repeat groups, flow-SDE inside a random window, group advantages, PPO-clip on the
    replayed window with an x-space KL to the starting weights."""

    def __init__(self, spec: StageSpec) -> None:
        stage = StageConfig.model_validate(spec.config)
        self.train, self.sampling = stage.train, stage.sampling
        assert self.sampling is not None and self.sampling.dynamics == "flow-sde" and self.sampling.guidance == 1.0
        adapter = build_adapter(stage, spec)
        self.net = adapter.module()
        self.net.train()
        self.ref = copy.deepcopy(self.net).requires_grad_(False) if self.train["kl_beta"] > 0 else None
        inputs = load_stage_inputs(spec)
        self.table = inputs.conditions
        self.pool = inputs.prompts
        self.rewards = build_rewards(stage.rewards, spec, inputs)
        self.shape = adapter.latent_shape
        grid = torch.linspace(1.0, 0.0, self.sampling.steps + 1, dtype=torch.float64)
        shift = stage.model.shift
        self.sigmas = (shift * grid / (1.0 + (shift - 1.0) * grid)).float()
        self.opt = _Optimised(self.net, self.train, stage.callbacks.ema.decay if stage.callbacks.ema else None)
        self.generator = torch.Generator().manual_seed(spec.seed)

    def _transition(self, v: Tensor, x: Tensor, sigma: Tensor, sigma_next: Tensor) -> tuple[Tensor, Tensor]:
        return flow_sde_transition(v, x, sigma, sigma_next, self.sampling.noise_level)

    @torch.no_grad()
    def _rollout(self) -> dict[str, Any]:
        train, g = self.train, self.generator
        picks = torch.randperm(len(self.pool), generator=g)[: train["prompts_per_iteration"]].tolist()
        k = train["group_size"]
        prompts = [self.pool[i][0] for i in picks for _ in range(k)]
        metadata = [self.pool[i][1] for i in picks for _ in range(k)]
        groups = torch.arange(len(picks)).repeat_interleave(k)
        cond = self.table.lookup(prompts)
        width = self.sampling.window or self.sampling.steps - 1
        start = int(torch.randint(0, self.sampling.steps - width, (1,), generator=g))
        window = range(start, start + width)
        x = torch.randn((len(prompts), *self.shape), generator=g)
        stored: dict[str, list[Tensor]] = {"x": [], "next": [], "log_prob": []}
        sigmas = self.sigmas
        for j in range(len(sigmas) - 1):
            sigma, sigma_next = sigmas[j].expand(len(x)), sigmas[j + 1].expand(len(x))
            v = _velocity(self.net, x, sigma, cond)
            if j in window:
                mean, std = self._transition(v, x, sigma, sigma_next)
                nxt = mean + std * torch.randn(x.shape, generator=g)
                stored["x"].append(x)
                stored["next"].append(nxt)
                stored["log_prob"].append(log_prob(nxt, mean, std))
                x = nxt
            else:
                x = x + (sigmas[j + 1] - sigmas[j]) * v
        rewards = self.rewards(((x + 1.0) / 2.0).clamp(0.0, 1.0), prompts, metadata).total
        means = torch.zeros(len(picks)).index_add(0, groups, rewards) / k
        centred = rewards - means[groups]
        stds = (torch.zeros(len(picks)).index_add(0, groups, centred**2) / k).sqrt()[groups]
        bound = train["advantage_clip"]
        advantages = torch.where(stds > 0, centred / (stds + 1e-4), 0.0).clamp(-bound, bound)
        return {
            "cond": cond,
            "window": window,
            "advantages": advantages,
            **{key: torch.stack(values, dim=1) for key, values in stored.items()},
        }

    def _replay_loss(self, rollout: dict[str, Any], rows: Tensor) -> None:
        window, size = rollout["window"], len(rows)
        steps = len(window)
        x = rollout["x"][rows].transpose(0, 1).flatten(0, 1)
        target = rollout["next"][rows].transpose(0, 1).flatten(0, 1)
        sigma = self.sigmas[window.start : window.stop].repeat_interleave(size)
        sigma_next = self.sigmas[window.start + 1 : window.stop + 1].repeat_interleave(size)
        cond = rollout["cond"].index(rows.repeat(steps))
        mean, std = self._transition(_velocity(self.net, x, sigma, cond), x, sigma, sigma_next)
        current = log_prob(target, mean, std).view(steps, size)
        kl = torch.zeros(steps, size)
        if self.ref is not None:
            with torch.no_grad():
                ref_mean, _ = self._transition(_velocity(self.ref, x, sigma, cond), x, sigma, sigma_next)
            kl = ((mean - ref_mean) ** 2 / (2.0 * std**2)).flatten(1).mean(1).view(steps, size)
        advantages = rollout["advantages"][rows]
        old = rollout["log_prob"][rows].T
        ratio = torch.exp(current - old)
        clip = self.train["clip_range"]
        policy = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)).mean(1)
        loss = (policy + self.train["kl_beta"] * kl.mean(1)).sum() / steps
        loss.backward()

    def iteration(self) -> None:
        """One rollout iteration: sample, score, then one optimizer step per training micro-batch."""
        rollout = self._rollout()
        order = torch.randperm(len(rollout["advantages"]), generator=self.generator)
        for rows in order.split(self.train["train_batch_size"]):
            self._replay_loss(rollout, rows)
            self.opt.step()

    def timed(self, iterations: int) -> list[float]:
        """Seconds of each of ``iterations`` iterations after a first, untimed one."""
        self.iteration()
        seconds = []
        for _ in range(iterations - 1):
            start = time.perf_counter()
            self.iteration()
            seconds.append(time.perf_counter() - start)
        return seconds
