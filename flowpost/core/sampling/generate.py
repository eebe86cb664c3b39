"""Generate images or videos from a model: the one sampling path of validation grids, evaluation and ``sample``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from flowpost.core.conditions import NULL_PROMPT, ConditionBatch
from flowpost.core.evaluation.grid import save_grid
from flowpost.core.evaluation.video import save_video
from flowpost.core.io import check_output_file, read_json
from flowpost.core.models.base import ADAPTER_FILE, ModelAdapter
from flowpost.core.models.pipeline_family import PipelineFamily
from flowpost.core.models.registry import adapter_class
from flowpost.core.noise import addressed_randn
from flowpost.core.sampling.ode import sample_ode
from flowpost.errors import FlowpostError

GRID_FILE, VIDEO_FILE = "grid.png", "sample.mp4"  # what ``sample_prompts`` writes without ``out``


def model_device(adapter: ModelAdapter) -> torch.device:
    """The device of the adapter's network (CPU for a network without parameters)."""
    first = next(adapter.module().parameters(), None)
    return first.device if first is not None else torch.device("cpu")


@torch.no_grad()
def generate_images(
    adapter: ModelAdapter,
    conditions: ConditionBatch,
    negative: ConditionBatch | None,
    *,
    indices: Sequence[int],
    seed: int,
    stage: str,
    steps: int,
    guidance: float,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Decoded samples [len(indices), C, H, W] (videos: [len(indices), C, T, H, W]) in [0, 1], on the CPU.

    Row ``i`` is conditioned on ``conditions[i]`` and starts from the noise addressed by
    ``(seed, stage, 0, indices[i])``, so it does not depend on the batching. ``negative`` is the
    null-prompt condition (one row, or one per sample); it is needed only when ``guidance != 1``.
    Sampling runs on ``device`` (default: the network's) in eval mode; the network's train/eval
    mode is restored afterwards.
    """
    indices = [int(i) for i in indices]
    if len(conditions) != len(indices):
        raise ValueError(f"{len(conditions)} condition rows for {len(indices)} sample indices")
    if guidance != 1.0 and negative is None:
        raise ValueError("guidance != 1 needs the negative (null-prompt) conditions")
    if negative is not None and len(negative) not in (1, len(indices)):
        raise ValueError(f"negative conditions need 1 or {len(indices)} rows, got {len(negative)}")
    device = torch.device(device) if device is not None else model_device(adapter)
    sigmas = adapter.inference_sigmas(steps)
    chunk = batch_size or max(1, len(indices))
    model = adapter.module()
    was_training = model.training
    model.eval()
    outputs: list[Tensor] = []
    try:
        for start in range(0, len(indices), chunk):
            rows = list(range(start, min(start + chunk, len(indices))))
            noise = addressed_randn(
                adapter.latent_shape, seed=seed, stage=stage, step=0, indices=[indices[r] for r in rows]
            ).to(device)
            state = adapter.prepare_condition_state(conditions.index(rows).to(device))
            neg = None
            if guidance != 1.0 and negative is not None:
                neg_rows = [0] * len(rows) if len(negative) == 1 else rows
                neg = adapter.prepare_condition_state(negative.index(neg_rows).to(device))
            latents = sample_ode(adapter, noise, state, sigmas, guidance=guidance, negative=neg)
            outputs.append(adapter.decode(latents).cpu())
    finally:
        model.train(was_training)
    if not outputs:
        return torch.empty((0, *adapter.latent_shape))
    return torch.cat(outputs)


def load_sampler(model_dir: Path, base: str | None = None) -> ModelAdapter:
    """The model saved in ``model_dir`` (an export, or any folder ``save_pretrained`` wrote). A family loaded
    from a pipeline reads its VAE and text encoders from it (``PipelineFamily.base_source``); one that cannot
    be reached is a one-line FlowpostError naming the folder and the two ways out."""
    family = read_json(model_dir / ADAPTER_FILE, what="model adapter manifest")["family"]
    cls = adapter_class(family, where=str(model_dir))
    if not issubclass(cls, PipelineFamily):
        if base is not None:
            raise FlowpostError(f"the {family} family is not loaded from a pipeline; drop --base", where="--base")
        return cls.from_pretrained(model_dir)
    source = cls.base_source(model_dir, base)
    if problem := source.unreachable():
        raise FlowpostError(
            f"it samples with the VAE and text encoders of its base pipeline, and {problem}; pass --base with "
            "that pipeline's folder or hub id, or export with `formats: [diffusers, pipeline]` for a folder "
            "that samples on its own",
            where=str(model_dir),
        )
    return cls.from_pretrained(model_dir, base=base)


@torch.no_grad()
def sample_prompts(
    model_dir: str | Path,
    prompts: list[str],
    *,
    out: str | Path | None = None,
    steps: int = 20,
    guidance: float = 1.0,
    seed: int = 0,
    nrow: int | None = None,
    device: torch.device | str | None = None,
    base: str | None = None,
) -> tuple[Tensor, Path]:
    """Encode ``prompts``, integrate the ODE from addressed noise, write the samples; returns them and the file.

    Images go to a PNG grid; videos to an mp4 (the clips tiled, at the model's ``fps``) or, for an ``out``
    ending in ``.png``, a grid of their frames. Without ``out``: ``grid.png`` or ``sample.mp4``. A folder as
    ``out``, or a file as ``model_dir``, is a FlowpostError before anything is loaded. ``base``: the pipeline
    folder or hub id to read the VAE and text encoders from instead of the one the model's manifest names.
    """
    if out is not None:
        check_output_file(out, where="--out")
    if not Path(model_dir).exists():
        raise FlowpostError(f"{model_dir} does not exist; give an export (or saved model) folder", where="sample")
    if not Path(model_dir).is_dir():
        raise FlowpostError(f"{model_dir} is a file; give an export (or saved model) folder", where="sample")
    adapter = load_sampler(Path(model_dir), base)
    if device is not None:
        adapter.module().to(device)
    conditions = adapter.encode_conditions(prompts)
    negative = adapter.encode_conditions([NULL_PROMPT]) if guidance != 1.0 else None
    images = generate_images(
        adapter,
        conditions,
        negative,
        indices=range(len(prompts)),
        seed=seed,
        stage="sample",
        steps=steps,
        guidance=guidance,
    )
    video = images.ndim == 5
    path = Path(out) if out is not None else Path(VIDEO_FILE if video else GRID_FILE)
    nrow = nrow or max(1, int(len(prompts) ** 0.5))
    if video and path.suffix == ".mp4":
        save_video(images, path, fps=adapter.fps, nrow=nrow)
    elif path.suffix == ".mp4":
        raise FlowpostError(f"{adapter.family!r} makes images; give a .png file", where="--out")
    elif video and path.suffix != ".png":
        raise FlowpostError(
            f"{adapter.family!r} makes videos; give a .mp4 file (or a .png for a grid of their frames)", where="--out"
        )
    else:
        save_grid(images, path, nrow=nrow)
    return images, path
