"""Memory preflight: each training stage of a real family, sized per GPU from its pipeline's configs alone
(the transformer built on the meta device, LoRA added as the stage adds it; no weight is read)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from flowpost.core.config.loading import network_model
from flowpost.core.config.schema.models import ModelConfig
from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.core.config.schema.stages import StageConfig
from flowpost.core.contracts import Acquisition
from flowpost.core.live_bytes import FusedAttention, LiveBytes
from flowpost.core.memory import GIB, MemoryEstimate, estimate_memory
from flowpost.core.models.footprint import ModelFootprint, model_footprint
from flowpost.core.models.pipeline_family import PipelineFamily
from flowpost.core.models.precision import upcast_trainable
from flowpost.core.models.pretrained import PretrainedSource, is_hub_id
from flowpost.core.models.quantize import quantize_frozen
from flowpost.core.models.registry import adapter_class
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import OnlineArguments
from flowpost.core.trainers.registry import trainer_class
from flowpost.errors import FlowpostError

HALF = ("bfloat16", "float16")
DEFAULT_TEXT_TOKENS = 16  # a stage without a condition cache (the schema's max_length default)


@dataclass(frozen=True)
class StageMemory:
    """One stage's estimate, or why there is none (``note``)."""

    stage: str
    family: str
    fine_tune: str  # "LoRA r32", "full", with the memory options in force: ", int8 base", ", adamw8bit"
    world_size: int
    footprint: ModelFootprint | None = None
    estimate: MemoryEstimate | None = None
    note: str = ""


def stage_memory(config: PipelineConfig) -> list[StageMemory]:
    """The estimate of every training stage whose model is (or starts from) a real family's pipeline."""
    rows = []
    for name, stage in config.stages.items():
        model = base_model(config, name)
        if model is None:
            continue
        lora, quantize = stage.model.lora, stage.model.quantize
        fine_tune = f"LoRA r{lora.rank}" if lora is not None else "full"
        fine_tune += f", {quantize} base" if quantize != "none" else ""
        fine_tune += ", adamw8bit" if eight_bit_roles(stage) else ""
        world = stage.launch.num_processes
        try:
            adapter = stage_adapter(stage, model)
        except (FlowpostError, AttributeError, KeyError, TypeError, ValueError) as error:  # a plan still prints
            rows.append(StageMemory(name, model.family, fine_tune, world, note=f"not estimated: {error}"))
            continue
        footprint = model_footprint(adapter)
        estimate = stage_estimate(config, name, footprint, prepare_vae=adapter.prepare_vae)
        rows.append(StageMemory(name, model.family, fine_tune, world, footprint, estimate))
    return rows


def stage_estimate(
    config: PipelineConfig,
    name: str,
    footprint: ModelFootprint,
    *,
    prepare_vae: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
) -> MemoryEstimate:
    """Stage ``name``'s memory per GPU for a network of ``footprint``: its layout, roles, snapshots and batch;
    ``prepare_vae``: the family's VAE set-up (slicing), for the encode's trace."""
    stage = config.stages[name]
    model = base_model(config, name) or stage.model
    held = stage_snapshots(stage)
    hosted = {snapshot for snapshot in held if snapshot in stage.offload}
    return estimate_memory(
        footprint,
        world_size=stage.launch.num_processes,
        backend=stage.launch.backend,
        roles=max(1, len(trainer_class(stage.trainer).required_trainable_roles)),
        eight_bit_roles=eight_bit_roles(stage),
        snapshots=len(held - hosted),
        hosted_snapshots=len(hosted),
        micro_batch=micro_batch_per_gpu(stage),
        text_tokens=text_tokens(config, stage),
        activation_itemsize=2 if stage.launch.mixed_precision == "bf16" or model.torch_dtype in HALF else 4,
        lora=stage.model.lora is not None,
        codec_bytes=codec_bytes(stage, model),
        hosted_codec="vae" in stage.offload,
        codec_activation_bytes=encode_bytes(stage, model, footprint, prepare_vae),
    )


def codec_bytes(stage: StageConfig, model: ModelConfig) -> int:
    """The VAE the stage holds, in fp32, sized from its config on the meta device: every stage that encodes
    media or decodes samples (rewards, validation grids) holds it; none for one that reads a latent cache and
    never decodes, or whose VAE config is not a local file (a hub id is not fetched)."""
    codec = stage_codec(stage, model)
    return 0 if codec is None else 4 * sum(parameter.numel() for parameter in codec.parameters())


def encode_bytes(
    stage: StageConfig,
    model: ModelConfig,
    footprint: ModelFootprint,
    prepare_vae: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
) -> int:
    """The most bytes the VAE's encode of one micro-batch holds at once (fp32 activations; a causal video VAE's
    feature cache; its attention as a fused kernel holds it), traced on the meta device at the stage's pixels.
    A stage that encodes its media each step (no latent cache) needs it; one that reads latents, or generates,
    encodes nothing."""
    if trainer_class(stage.trainer).acquisition is Acquisition.GENERATION or not footprint.pixels:
        return 0
    if stage.data is None or stage.data.latents:
        return 0
    codec = stage_codec(stage, model)
    if codec is None:
        return 0
    codec = prepare_vae(codec) if prepare_vae is not None else codec
    pixels = torch.empty((micro_batch_per_gpu(stage), *footprint.pixels), device="meta")
    with torch.no_grad(), FusedAttention(), LiveBytes() as live:
        codec.encode(pixels).latent_dist.mode()
    return live.peak


def stage_codec(stage: StageConfig, model: ModelConfig) -> torch.nn.Module | None:
    """The stage's VAE in fp32 on the meta device, or None where it holds none (see ``codec_bytes``)."""
    generates = trainer_class(stage.trainer).acquisition is Acquisition.GENERATION
    decodes = generates or stage.callbacks.validation is not None
    if not decodes and stage.data is not None and stage.data.latents:
        return None
    if model.pretrained is None or is_hub_id(model.pretrained):
        return None
    config_file = Path((model.components or {}).get("vae") or Path(model.pretrained) / "vae") / "config.json"
    if not config_file.is_file():
        return None
    import diffusers

    config = json.loads(config_file.read_text())
    codec_class = getattr(diffusers, str(config.get("_class_name")), None)
    if codec_class is None:
        return None
    with torch.device("meta"):
        return codec_class.from_config(config).float().eval()


def eight_bit_roles(stage: StageConfig) -> int:
    """The stage's trainable networks whose optimizer keeps 8-bit moments (``adamw8bit``)."""
    if stage.optimizers:
        return sum(config.name == "adamw8bit" for config in stage.optimizers.values())
    return int(stage.arguments().optimizer == "adamw8bit")


def base_model(config: PipelineConfig, stage: str) -> ModelConfig | None:
    """The ``model`` with ``pretrained`` that ``stage`` trains or starts from (following ``model.init``)."""
    model = network_model(config, stage)
    return model if model is not None and model.pretrained is not None else None


def stage_adapter(stage: StageConfig, model: ModelConfig) -> PipelineFamily:
    """The stage's network without weights: its family on a meta-device transformer, with its quantized base
    and its LoRA, trainable parameters in fp32."""
    cls = adapter_class(model.family, where="model.family")
    if not issubclass(cls, PipelineFamily):
        raise FlowpostError(f"family {model.family!r} is not loaded from a diffusers pipeline", where="model.family")
    assert model.pretrained is not None
    components = model.components or {}
    source = PretrainedSource(model.pretrained, model.revision, model.variant, model.torch_dtype, components)
    adapter = cls.without_weights(source, **model.options)
    if stage.model.quantize != "none":
        quantize_frozen(adapter.module(), stage.model.quantize)
    lora = stage.model.lora
    if lora is not None:
        with torch.device("meta"):
            adapter.add_lora(rank=lora.rank, alpha=lora.alpha or float(lora.rank), targets=lora.targets)
    upcast_trainable(adapter.trainable_network())  # as the trainer keeps them: fp32 over a half-precision base
    return adapter


def stage_snapshots(stage: StageConfig) -> frozenset[Snapshot]:
    """The snapshots the stage holds: those its trainer declares under its arguments (built-in or plugin),
    and the EMA callback's."""
    held = trainer_class(stage.trainer).snapshots_held(stage.arguments())
    return held | {Snapshot.EMA} if stage.callbacks.ema is not None else held


def micro_batch_per_gpu(stage: StageConfig) -> int:
    """Samples one GPU trains at once: the global micro-batch over the ranks, twice with true CFG in training."""
    args = stage.arguments()
    if isinstance(args, OnlineArguments):
        guided = stage.sampling is not None and stage.sampling.guidance != 1.0
        return math.ceil(args.train_batch_size / stage.launch.num_processes) * (2 if guided else 1)
    return math.ceil(int(getattr(args, "batch_size", 1)) / stage.launch.num_processes)


def text_tokens(config: PipelineConfig, stage: StageConfig) -> int:
    """The token length of the stage's condition cache."""
    if stage.data is None or stage.data.conditions not in config.conditions:
        return DEFAULT_TEXT_TOKENS
    return config.conditions[stage.data.conditions].max_length


def visible_gpu_memory() -> float | None:
    """GiB of the first visible CUDA device, or None without one."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / GIB


def over_budget(rows: list[StageMemory], gpu_memory: float | None) -> list[str]:
    """A warning for each stage whose estimate exceeds ``gpu_memory`` GiB."""
    if gpu_memory is None:
        return []
    return [
        f"stages.{row.stage}: about {row.estimate.total / GIB:.1f} GiB per GPU, over the {gpu_memory:.0f} GiB of "
        "the GPU; lower train_batch_size or the resolution, use LoRA or a lower rank, gradient checkpointing, "
        "or launch.backend: fsdp2 over more processes"
        for row in rows
        if row.estimate is not None and row.estimate.total > gpu_memory * GIB
    ]


COLUMNS = (
    *("stage", "family", "fine-tune", "GPUs", "trainable"),
    *("weights", "grads", "optimizer", "snapshots", "activations", "VAE", "VAE encode", "total", "host"),
)


def cells(row: StageMemory) -> list[str]:
    """``row`` as the ``COLUMNS`` of a table: parameter counts in billions or millions, memory in GiB (``activations``:
    the kept ones with backward's transient gradients; ``host``: what ``offload`` keeps in each process's host
    memory instead)."""
    head = [row.stage, row.family, row.fine_tune, str(row.world_size)]
    if row.estimate is None or row.footprint is None:
        return [*head, row.note, *[""] * (len(COLUMNS) - len(head) - 1)]
    e = row.estimate
    activations = e.activations + e.backward_transient
    held = (e.weights, e.gradients, e.optimizer, e.snapshots, activations, e.codec, e.codec_activations)
    parts = (*held, e.total, e.host)
    return [*head, params_text(row.footprint.trainable), *(f"{part / GIB:.1f}" for part in parts)]


def params_text(count: int) -> str:
    return f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.1f} M"
