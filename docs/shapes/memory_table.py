"""Print the memory table of docs/speed-and-memory.md: the preflight's per-GPU estimate for the published
transformer shapes in this folder (configs only, built on the meta device: nothing is downloaded and no weight
is read).

    PYTHONPATH=. python docs/shapes/memory_table.py

Each row is a GRPO stage with bf16 weights and bf16 autocast, one training sample per GPU without CFG,
``kl_beta`` 0.04 (a reference snapshot), no EMA; one GPU replicated (ddp), eight sharded (fsdp2). A LoRA stage
over an int8 base (``model.quantize``) trains in one process only, so it has no eight-GPU figure; the row with every
memory option adds 8-bit AdamW moments and gradient checkpointing of every block. A family whose ranks run
different blocks (Wan2.2-A14B's experts) has no fsdp2 figure either. The offloaded column is the one-GPU stage with
``offload: [ref, vae]``: the reference snapshot and the VAE held in host memory (how much in brackets).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.memory import GIB
from flowpost.core.models.registry import adapter_class
from flowpost.tasks.preflight import params_text, stage_estimate, stage_memory

SHAPES = Path(__file__).resolve().parent
FAMILIES: dict[str, tuple[str, str, dict[str, Any], int]] = {  # family -> (shape folder, label, options, tokens)
    "sd3": ("sd3.5-medium", "SD3.5-Medium, 1024 px", {}, 256),
    "flux1": ("flux1-dev", "FLUX.1-dev, 512 px", {"resolution": 512}, 512),
    "flux2": ("flux2-dev", "FLUX.2-dev, 512 px", {"resolution": 512}, 512),
    "flux2-klein": ("flux2-klein-base-4b", "FLUX.2-klein-base-4B, 512 px", {"resolution": 512}, 512),
    "qwen-image": ("qwen-image", "Qwen-Image, 512 px", {"resolution": 512}, 256),
    "z-image": ("z-image-turbo", "Z-Image-Turbo, 512 px", {"resolution": 512}, 512),
    "wan2": (
        "wan2.1-t2v-1.3b",
        "Wan2.1-T2V-1.3B, 480x832x33, checkpointed",
        {"height": 480, "width": 832, "num_frames": 33, "gradient_checkpointing": True},
        512,
    ),
    "wan22-a14b": (
        "wan2.2-t2v-a14b",
        "Wan2.2-T2V-A14B (both experts), 480x832x33, checkpointed",
        {"height": 480, "width": 832, "num_frames": 33, "gradient_checkpointing": True},
        512,
    ),
}
FINE_TUNES: dict[str, dict[str, Any]] = {  # stage suffix -> model.lora and model.quantize
    "lora": {"lora": {"rank": 32}},
    "lora-int8": {"lora": {"rank": 32}, "quantize": "int8"},
    "lora-int8-8bit": {"lora": {"rank": 32}, "quantize": "int8"},  # with adamw8bit and every block checkpointed
    "full": {"lora": None},
}
SMALLEST = "lora-int8-8bit"
OFFLOADED = ["ref", "vae"]


def pipeline(prompts: Path, gpus: int, *, offload: bool = False) -> dict[str, Any]:
    """One GRPO stage per family and fine-tune type on ``gpus`` GPUs (on one, also over an int8 base); ``offload``:
    with the reference and the VAE offloaded."""
    conditions, stages = {}, {}
    for family, (folder, _, options, tokens) in FAMILIES.items():
        source = {"family": family, "pretrained": str(SHAPES / folder)}
        key = family.replace("-", "")
        conditions[key] = {"model": source, "datasets": ["prompts"], "max_length": tokens}
        for suffix, fine_tune in FINE_TUNES.items():
            if gpus > 1 and ("quantize" in fine_tune or not adapter_class(family).fsdp_shardable):
                continue
            smallest = suffix == SMALLEST
            stages[f"{key}-{suffix}"] = {
                "trainer": "grpo",
                "model": {
                    **source,
                    "torch_dtype": "bfloat16",
                    "options": {**options, "gradient_checkpointing": True} if smallest else options,
                    **fine_tune,
                },
                "data": {"dataset": "prompts", "conditions": key},
                "rewards": [{"name": "jpeg_compressibility"}],
                "train": {
                    "iterations": 1,
                    "prompts_per_iteration": gpus,
                    "group_size": 2,
                    "train_batch_size": gpus,
                    "kl_beta": 0.04,
                    **({"optimizer": "adamw8bit"} if smallest else {}),
                },
                "launch": {"num_processes": gpus, "backend": "fsdp2" if gpus > 1 else "ddp", "mixed_precision": "bf16"},
                **({"offload": OFFLOADED} if offload else {}),
            }
    return {
        "name": "memory-table",
        "datasets": {"prompts": {"source": "prompt-files", "path": str(prompts)}},
        "conditions": conditions,
        "stages": stages,
        "evaluate": {"after": []},
    }


def table() -> str:
    """The markdown table: family, fine-tune, trainable parameters, GiB per GPU at 1 GPU (also with the reference
    and the VAE offloaded, the host memory they take in brackets) and at 8 GPUs."""
    with tempfile.TemporaryDirectory() as folder:
        prompts = Path(folder) / "prompts.txt"
        prompts.write_text("a photo of a cat\n")
        one = validate_pipeline(pipeline(prompts, 1))
        offloaded = validate_pipeline(pipeline(prompts, 1, offload=True))
        eight = validate_pipeline(pipeline(prompts, 8))
    lines = [
        "| model (shape) | fine-tune | trainable | transformer | GiB per GPU, 1 GPU | 1 GPU, ref and VAE offloaded "
        "(host GiB) | GiB per GPU, 8 GPUs (fsdp2) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    labels = {f"{family.replace('-', '')}-": label for family, (_, label, _, _) in FAMILIES.items()}
    for row in stage_memory(one):
        assert row.footprint is not None and row.estimate is not None, row.note
        label = next(text for prefix, text in labels.items() if row.stage.startswith(prefix))
        at_eight = (
            f"{stage_estimate(eight, row.stage, row.footprint).total / GIB:.1f}" if row.stage in eight.stages else "-"
        )
        host = stage_estimate(offloaded, row.stage, row.footprint)
        fine_tune = row.fine_tune + (
            ", checkpointed" if row.stage.endswith(SMALLEST) and "checkpointed" not in label else ""
        )
        lines.append(
            f"| {label} | {fine_tune} | {params_text(row.footprint.trainable)} | "
            f"{params_text(row.footprint.parameters - (row.footprint.trainable if row.fine_tune != 'full' else 0))} | "
            f"{row.estimate.total / GIB:.1f} | {host.total / GIB:.1f} ({host.host / GIB:.1f}) | {at_eight} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
