"""Sample prompts from a saved model into an image grid."""

from __future__ import annotations

from pathlib import Path

import torch

from flowpost.core.evaluation.grid import save_grid
from flowpost.core.models.registry import load_adapter
from flowpost.core.noise import addressed_randn
from flowpost.core.sampling.ode import sample_ode
from flowpost.core.sampling.schedules import inference_sigmas


@torch.no_grad()
def sample_prompts(
    model_dir: str | Path,
    prompts: list[str],
    *,
    out: str | Path,
    steps: int = 20,
    guidance: float = 1.0,
    seed: int = 0,
    nrow: int | None = None,
) -> torch.Tensor:
    """Encode ``prompts``, integrate the ODE from addressed noise, write a PNG grid; returns images."""
    adapter = load_adapter(model_dir)
    adapter.module().eval()
    state = adapter.prepare_condition_state(adapter.encode_conditions(prompts))
    negative = (
        adapter.prepare_condition_state(adapter.encode_conditions([""] * len(prompts)))
        if guidance != 1.0
        else None
    )
    noise = addressed_randn(
        adapter.latent_shape, seed=seed, stage="sample", step=0, indices=range(len(prompts))
    )
    latents = sample_ode(
        adapter,
        noise,
        state,
        inference_sigmas(steps, shift=adapter.shift),
        guidance=guidance,
        negative=negative,
    )
    images = adapter.decode(latents)
    save_grid(images, out, nrow=nrow or max(1, int(len(prompts) ** 0.5)))
    return images
