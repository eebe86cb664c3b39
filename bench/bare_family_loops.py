"""Bare SFT steps written directly against diffusers, one per pipeline family (sd3, flux1, qwen-image, wan2).

The baseline of ``family_step.py``: the pipeline folder's transformer and VAE loaded with diffusers'
``from_pretrained``, the VAE's posterior mean scaled (and packed) as the stock pipeline's latents, the
transformer called as the stock pipeline calls it (sd3: pooled projections, ``timestep = sigma * 1000``;
flux1: packed latents, image and text ids, distilled guidance, ``timestep = sigma``; qwen-image: packed
latents, the text mask and the image's patch grid; wan2: video latents, the zero-padded UMT5 states),
the flow-matching loss with logit-normal sigmas shifted by the scheduler's ``shift`` (unshifted when it
shifts dynamically) and caption dropout, backward and an AdamW step. Wan's 3-D VAE encodes one clip at a
time (sliced), as flowpost's wan2 does to bound a real clip's memory: batched, the tiny clips encode
faster, a memory policy rather than overhead. The batches and their cached conditions are the stage's own; noise
comes from one seeded generator unless ``draws`` gives it. None of flowpost's model adapters, trainer,
addressed noise, events or checks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from flowpost.core.conditions import NULL_PROMPT, ConditionBatch
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.stage_inputs import load_stage_inputs

FLUX_GUIDANCE = 3.5  # FluxPipeline's default guidance_scale, fed to FLUX.1-dev's guidance embedding
Draws = Callable[[int, tuple[int, ...]], tuple[Tensor, Tensor, Tensor]]  # (step, shape) -> noise, normals, uniforms


def _kl_latents(vae: torch.nn.Module, pixels: Tensor) -> Tensor:
    """``AutoencoderKL``: ``(mode - shift_factor) * scaling_factor`` of media in [0, 1]."""
    latents = vae.encode(pixels * 2.0 - 1.0).latent_dist.mode()
    return (latents - vae.config.shift_factor) * vae.config.scaling_factor


def _normalised(vae: torch.nn.Module, latents: Tensor) -> Tensor:
    """``(z - latents_mean) / latents_std`` per channel (``AutoencoderKLWan`` and ``AutoencoderKLQwenImage``)."""
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents)
    return (latents - mean) * inverse_std


def sd3_latents(vae: torch.nn.Module, pixels: Tensor) -> Tensor:
    return _kl_latents(vae, pixels)


def sd3_velocity(net: torch.nn.Module, x: Tensor, sigma: Tensor, cond: ConditionBatch) -> Tensor:
    return net(
        hidden_states=x,
        encoder_hidden_states=cond.token_states,
        pooled_projections=cond.pooled,
        timestep=sigma * 1000.0,
        return_dict=False,
    )[0]


def flux1_latents(vae: torch.nn.Module, pixels: Tensor) -> Tensor:
    from diffusers import FluxPipeline

    latents = _kl_latents(vae, pixels)
    return FluxPipeline._pack_latents(latents, *latents.shape)


def flux1_velocity(net: torch.nn.Module, x: Tensor, sigma: Tensor, cond: ConditionBatch) -> Tensor:
    from diffusers import FluxPipeline

    batch, side = x.shape[0], math.isqrt(x.shape[1])
    guidance = None
    if net.config.guidance_embeds:
        guidance = torch.full((batch,), FLUX_GUIDANCE, device=x.device, dtype=torch.float32)
    return net(
        hidden_states=x,
        timestep=sigma,
        guidance=guidance,
        pooled_projections=cond.pooled,
        encoder_hidden_states=cond.token_states,
        txt_ids=torch.zeros(cond.token_states.shape[1], 3, device=x.device, dtype=x.dtype),
        img_ids=FluxPipeline._prepare_latent_image_ids(batch, side, side, x.device, x.dtype),
        return_dict=False,
    )[0]


def qwen_image_latents(vae: torch.nn.Module, pixels: Tensor) -> Tensor:
    from diffusers import QwenImagePipeline

    latents = _normalised(vae, vae.encode((pixels * 2.0 - 1.0).unsqueeze(2)).latent_dist.mode())
    batch, channels, _, height, width = latents.shape
    return QwenImagePipeline._pack_latents(latents, batch, channels, height, width)


def qwen_image_velocity(net: torch.nn.Module, x: Tensor, sigma: Tensor, cond: ConditionBatch) -> Tensor:
    """The text states up to the batch's longest prompt with their mask (none when nothing is padded)."""
    real = cond.token_mask.bool()
    length = int(real.any(dim=0).nonzero().max()) + 1
    mask = real[:, :length]
    batch, side = x.shape[0], math.isqrt(x.shape[1])
    return net(
        hidden_states=x,
        timestep=sigma,
        encoder_hidden_states=cond.token_states[:, :length],
        encoder_hidden_states_mask=None if bool(mask.all()) else mask,
        img_shapes=[[(1, side, side)]] * batch,
        return_dict=False,
    )[0]


def wan2_latents(vae: torch.nn.Module, pixels: Tensor) -> Tensor:
    return _normalised(vae, vae.encode(pixels * 2.0 - 1.0).latent_dist.mode())


def wan2_velocity(net: torch.nn.Module, x: Tensor, sigma: Tensor, cond: ConditionBatch) -> Tensor:
    return net(hidden_states=x, timestep=sigma * 1000.0, encoder_hidden_states=cond.token_states, return_dict=False)[0]


@dataclass(frozen=True)
class BareFamily:
    """A family's diffusers classes, its latents from media and its transformer call."""

    transformer_class: str
    vae_class: str
    latents: Callable[[torch.nn.Module, Tensor], Tensor]
    velocity: Callable[[torch.nn.Module, Tensor, Tensor, ConditionBatch], Tensor]
    sliced: bool = False  # the VAE encodes one item of a batch at a time (diffusers' ``enable_slicing``)


BARE_FAMILIES = {
    "sd3": BareFamily("SD3Transformer2DModel", "AutoencoderKL", sd3_latents, sd3_velocity),
    "flux1": BareFamily("FluxTransformer2DModel", "AutoencoderKL", flux1_latents, flux1_velocity),
    "qwen-image": BareFamily(
        "QwenImageTransformer2DModel", "AutoencoderKLQwenImage", qwen_image_latents, qwen_image_velocity
    ),
    "wan2": BareFamily("WanTransformer3DModel", "AutoencoderKLWan", wan2_latents, wan2_velocity, sliced=True),
}


@dataclass(frozen=True)
class SFTSettings:
    """The SFT stage's ``train:`` values the bare step uses."""

    lr: float
    batch_size: int
    logit_mean: float = 0.0
    logit_std: float = 1.0
    cfg_dropout: float = 0.1
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)


class BareFamilyStep:
    """One SFT step of ``family`` on the pipeline folder ``folder``, full fine-tuning of its transformer."""

    def __init__(
        self, family: str, folder: Path, spec: StageSpec, settings: SFTSettings, *, draws: Draws | None = None
    ) -> None:
        import diffusers

        self.bare = BARE_FAMILIES[family]
        self.settings = settings
        self.net = getattr(diffusers, self.bare.transformer_class).from_pretrained(folder, subfolder="transformer")
        self.net.train()
        vae = getattr(diffusers, self.bare.vae_class).from_pretrained(folder, subfolder="vae")
        if self.bare.sliced:
            vae.enable_slicing()
        self.vae = vae.eval().requires_grad_(False)
        scheduler = diffusers.FlowMatchEulerDiscreteScheduler.load_config(folder, subfolder="scheduler")
        # a dynamically shifting scheduler ignores ``shift``: diffusers' FLUX and Qwen-Image scripts train unshifted
        self.shift = 1.0 if scheduler.get("use_dynamic_shifting") else float(scheduler["shift"])
        self.optimizer = torch.optim.AdamW(
            self.net.parameters(), lr=settings.lr, betas=settings.adam_betas, weight_decay=settings.weight_decay
        )
        inputs = load_stage_inputs(spec)
        self.table = inputs.conditions
        loader = inputs.demonstrations(global_batch_size=settings.batch_size, seed=spec.seed, rank=0, world_size=1)
        self.batches = [(batch["image"], batch["prompt"]) for batch in loader.iter_epoch(0)]
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.draws = draws or self._seeded_draws
        self.steps = 0
        self.cpu_seconds: list[float] = []  # this process's CPU seconds (all threads) of each timed step

    def _seeded_draws(self, step: int, shape: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
        g = self.generator
        return torch.randn(shape, generator=g), torch.randn(shape[0], generator=g), torch.rand(shape[0], generator=g)

    def step(self) -> float:
        """One optimizer step on the next batch of the stage's first epoch; returns its loss."""
        settings = self.settings
        pixels, prompts = self.batches[self.steps % len(self.batches)]
        with torch.no_grad():
            x0 = self.bare.latents(self.vae, pixels)
        noise, normals, uniforms = (t.to(x0) for t in self.draws(self.steps, tuple(x0.shape)))
        u = torch.sigmoid(settings.logit_mean + settings.logit_std * normals)
        sigma = self.shift * u / (1.0 + (self.shift - 1.0) * u)
        dropped = (uniforms < settings.cfg_dropout).tolist()
        kept = [NULL_PROMPT if drop else p for p, drop in zip(prompts, dropped, strict=True)]
        cond = self.table.lookup(kept).to(x0.device, x0.dtype)
        s = sigma.view(-1, *([1] * (x0.dim() - 1)))
        velocity = self.bare.velocity(self.net, (1.0 - s) * x0 + s * noise, sigma, cond)
        loss = (velocity - (noise - x0)).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return float(loss.detach())

    def timed(self, steps: int) -> list[float]:
        """Wall seconds of each of ``steps`` steps after a first, untimed one (CPU seconds in ``cpu_seconds``)."""
        self.step()
        seconds = []
        for _ in range(steps - 1):
            start, cpu = time.perf_counter(), time.process_time()
            self.step()
            seconds.append(time.perf_counter() - start)
            self.cpu_seconds.append(time.process_time() - cpu)
        return seconds
