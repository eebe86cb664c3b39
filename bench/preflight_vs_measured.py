"""The memory preflight against a measurement: each shape-faithful checkpoint's training stage, its peak
memory as ``flowpost plan`` estimates it and as a CPU process measures it, for the same configuration.

    python bench/preflight_vs_measured.py [--workspace bench-ws] [--checkpoints sd3.5-medium flux1-dev ...]
                                          [--variants lora full ...] [--resolution 128] [--steps 2]

The folders are ``tests/shape_faithful/build.py``'s (the published configs and widths, one block of each
kind, bf16 weights); an edit checkpoint's conditions are seeded (``seeded_edit_conditions``) with its source at
the stock pipeline's 1024 px whatever the stage's resolution (4096 packed tokens), as its conditions node caches them.
Each variant trains one stage (SFT, the VAE encoding each batch) in a fresh process
(``full-high``: Wan2.2-A14B's high-noise expert trained whole beside the frozen low-noise one). The process first
computes the preflight's estimate for the stage's config on one process (which imports the family's classes), then
reads its anonymous resident memory (the baseline), builds the stage, loads its VAE (else the first encode loads it,
its bf16 copy in that step's peak: host memory on a GPU) and runs ``--steps`` optimizer steps (its output folder
deleted after them). Torch's CPU allocator keeps no statistics, so the resident set stands in for them, made to
follow live tensors: glibc returns every freed block over 64 KiB at once (``MALLOC_MMAP_THRESHOLD_``, no allocator
caching); file-backed pages (library code) are left out; the tensors that the loader mapped from ``.safetensors``
files count whole, as a GPU holds them (a file stays mapped for any tensor it kept: the FLUX.2 VAE's batch-norm step
counter kept its 0.16 GiB file, converted to fp32, mapped). Each step's peak resident set is reset at the end of the
previous step (``/proc/self/clear_refs``); the measured figure is the largest step peak above the baseline (the
checkpoint and final weights, written after the last step, are left out: on a GPU they are written from host
memory). The Python heap and library buffers the steps allocate still count there, not in the estimate. Goal: the
measurement within +-25 % of the estimate. Writes ``WORKSPACE/preflight_vs_measured.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
TESTS = BENCH.parent / "tests"
sys.path[:0] = [str(TESTS)]

from process_memory import anonymous, mapped_resident, mapped_tensors, peak, reset_peak  # noqa: E402
from shape_faithful.build import CHECKPOINTS, build_folder, is_edit, seeded_edit_conditions  # noqa: E402

from flowpost.core.callbacks.base import Callback  # noqa: E402

FINGERPRINT = "preflight-bench-encoders"
TEXT_TOKENS = 128  # the condition cache's token length, as the estimate's conditions declare it
PROMPTS = ["a red cat", "a blue car", "a green tree", "a white house"]
VARIANTS: dict[str, dict[str, Any]] = {  # the stage's model and train sections on top of the common ones
    "lora": {"model": {"lora": {"rank": 32, "alpha": 32}}, "train": {}},
    "full": {"model": {}, "train": {}},
    # Wan2.2-A14B: the high-noise expert trained whole, the low-noise one frozen (both whole: 18 GiB, over 15)
    "full-high": {"model": {"options": {"experts": "high"}}, "train": {}},
}
GOAL = 0.25
CHILD_ENV = {  # one thread; glibc hands every block over 64 KiB back on free, so the resident set follows live tensors
    "OMP_NUM_THREADS": "1",
    "MALLOC_MMAP_THRESHOLD_": "65536",
}


VIDEO = ("wan2", "wan22-a14b")


def family_options(family: str, resolution: int) -> dict[str, Any]:
    if family in VIDEO:
        return {"height": resolution, "width": resolution, "num_frames": 5}
    return {"resolution": resolution}


def media_shape(family: str, resolution: int) -> tuple[int, ...]:
    return (3, 5, resolution, resolution) if family in VIDEO else (3, resolution, resolution)


def source_grid(family: str) -> int:
    """The side in packed tokens of an edit family's source as its conditions node reads it: ``source_side``
    pixels (1024 whatever the stage's resolution), the VAE's 8x and the 2 x 2 packing."""
    from flowpost.core.models.registry import adapter_class

    return adapter_class(family).source_side() // 16


def stage_config(checkpoint: str, folder: Path, variant: str, resolution: int, steps: int) -> dict[str, Any]:
    family = CHECKPOINTS[checkpoint].family
    extra = VARIANTS[variant]
    model = {
        "family": family,
        "pretrained": str(folder),
        "torch_dtype": "bfloat16",
        **extra["model"],
        "options": {**family_options(family, resolution), **extra["model"].get("options", {})},
    }
    train = {"lr": 1e-5, "batch_size": 2, "max_steps": steps, "checkpoint_every": 0, "warmup_steps": 0}
    return {"trainer": "sft", "model": model, "train": {**train, **extra["train"]}}


def prepare(root: Path, checkpoint: str, resolution: int) -> Path:
    """The checkpoint's folder, demonstrations at ``resolution`` and their condition cache under ``root``."""
    from flowpost.core.io import write_json_atomic
    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class
    from flowpost.data.condition_cache import update_condition_cache
    from flowpost.data.records import Demonstration
    from flowpost.data.shards import write_shards

    folder = root / "pipeline"
    if not (folder / "model_index.json").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        build_folder(checkpoint, folder, seed=0)
    family = CHECKPOINTS[checkpoint].family
    data = root / f"data-{resolution}"
    if not (data / "train" / "manifest.json").is_file():
        rng = np.random.default_rng(0)
        records = [
            Demonstration(key=f"r{i}", prompt=p, image=rng.random(media_shape(family, resolution), dtype=np.float32))
            for i, p in enumerate(PROMPTS)
        ]
        write_json_atomic(data / "train" / "manifest.json", write_shards(records, data / "train"))
    conditions = root / "conditions"
    if not conditions.is_dir() and is_edit(checkpoint):
        encode = partial(seeded_edit_conditions, checkpoint, grid=source_grid(family), text_tokens=TEXT_TOKENS)
        update_condition_cache(conditions, ["", *PROMPTS], encoder_fingerprint=FINGERPRINT, encode=encode)
    if not conditions.is_dir():
        encoder = adapter_class(family).prompt_encoder(PretrainedSource(str(folder)), max_length=TEXT_TOKENS)
        try:
            update_condition_cache(conditions, ["", *PROMPTS], encoder_fingerprint=FINGERPRINT, encode=encoder.encode)
        finally:
            encoder.release()
    return folder


class StepPeak(Callback):
    """The most bytes the stage held during any optimizer step (checkpoints come after the last): each step's
    peak resident set less its file-backed pages (library code the step's kernels touched, weights read from mapped
    files), plus the mapped weight files whole (the loader maps ``.safetensors`` files it need not convert; a GPU
    holds them whole), the peak reset at the end of each step."""

    def __init__(self) -> None:
        self.bytes = 0

    def on_step_end(self, trainer: Any, metrics: dict[str, float]) -> None:
        weights = mapped_tensors(".safetensors", tensor_storages())
        self.bytes = max(self.bytes, peak() - mapped_resident() + weights)
        reset_peak()


def tensor_storages() -> dict[int, int]:
    """The storages of the live CPU tensors: where each starts, its bytes."""
    import torch

    found = {}
    for item in gc.get_objects():
        if isinstance(item, torch.Tensor) and item.device.type == "cpu" and item.layout is torch.strided:
            storage = item.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()
    return found


def measure(root: Path, checkpoint: str, variant: str, resolution: int, steps: int) -> dict[str, Any]:
    """Run in a fresh process: the preflight's estimate (which imports the family's classes), then the stage's
    allocated peak above the baseline taken after it."""
    import torch

    from flowpost.core.config.schema import StageConfig
    from flowpost.core.trainers.spec import StageSpec
    from flowpost.stage import build_trainer

    torch.set_num_threads(1)
    config = stage_config(checkpoint, root / "pipeline", variant, resolution, steps)
    out = root / f"run-{variant}"
    shutil.rmtree(out, ignore_errors=True)
    spec = StageSpec(
        stage="sft",
        seed=0,
        config=StageConfig.model_validate(config).model_dump(mode="json"),
        output_dir=str(out),
        dataset_dir=str(root / f"data-{resolution}"),
        conditions_dir=str(root / "conditions"),
        encoder_fingerprint=FINGERPRINT,
        resume=False,
    )
    estimated = estimate(root, checkpoint, variant, resolution, steps)
    gc.collect()
    baseline = anonymous()
    trainer = build_trainer(spec)
    trainer.adapter.vae_on(trainer.accelerator.device)  # else loaded by the first encode, its bf16 copy in the peak
    loaded = anonymous() + mapped_tensors(".safetensors", tensor_storages()) - baseline
    recorder = StepPeak()
    trainer.callbacks.callbacks["step_peak"] = recorder
    gc.collect()
    reset_peak()
    trainer.start()
    shutil.rmtree(out)  # its checkpoint and export: gigabytes
    return {**estimated, "loaded_bytes": loaded, "measured_bytes": recorder.bytes - baseline}


def estimate(root: Path, checkpoint: str, variant: str, resolution: int, steps: int) -> dict[str, Any]:
    from flowpost.core.config.loading import validate_pipeline
    from flowpost.tasks.preflight import stage_memory

    folder = root / "pipeline"
    stage = stage_config(checkpoint, folder, variant, resolution, steps)
    family = CHECKPOINTS[checkpoint].family
    config = {
        "name": "preflight-bench",
        "datasets": {
            "images": {"source": "image-folder", "path": str(TESTS / "data" / "folder"), "preprocess": {"mode": "rgb"}}
        },
        "conditions": {
            "text": {
                "model": {"family": family, "pretrained": str(folder)},
                "datasets": ["images"],
                "max_length": TEXT_TOKENS,
            }
        },
        "stages": {"sft": {**stage, "data": {"dataset": "images", "conditions": "text"}}},
        "evaluate": {"after": []},
    }
    pipeline = validate_pipeline(config, source="preflight bench")
    (row,) = stage_memory(pipeline)
    assert row.estimate is not None, row.note
    parts = {name: float(getattr(row.estimate, name)) for name in row.estimate.__dataclass_fields__}
    return {"fine_tune": row.fine_tune, "estimate_bytes": row.estimate.total, "estimate_parts": parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--checkpoints", nargs="+", default=list(CHECKPOINTS), choices=list(CHECKPOINTS))
    parser.add_argument("--variants", nargs="+", default=["lora", "full"], choices=list(VARIANTS))
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--measure", nargs=2, metavar=("CHECKPOINT", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    base = args.workspace.resolve() / "preflight_vs_measured"
    if args.measure:
        checkpoint, variant = args.measure
        print(json.dumps(measure(base / checkpoint, checkpoint, variant, args.resolution, args.steps)))
        return
    rows = []
    for checkpoint in args.checkpoints:
        root = base / checkpoint
        prepare(root, checkpoint, args.resolution)
        for variant in args.variants:
            command = [sys.executable, __file__, "--workspace", str(args.workspace), "--measure", checkpoint, variant]
            command += ["--resolution", str(args.resolution), "--steps", str(args.steps)]
            done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **CHILD_ENV})
            if done.returncode != 0:
                raise SystemExit(f"{checkpoint} {variant} failed:\n{done.stderr[-4000:]}")
            measured = json.loads(done.stdout.strip().splitlines()[-1])
            row = {"checkpoint": checkpoint, "variant": variant, **measured}
            row["ratio"] = row["measured_bytes"] / row["estimate_bytes"]
            row["within_goal"] = abs(row["ratio"] - 1) <= GOAL
            rows.append(row)
            gib = 1024**3
            print(
                f"{checkpoint:16s} {variant:5s} estimate {row['estimate_bytes'] / gib:6.2f} GiB  "
                f"measured {row['measured_bytes'] / gib:6.2f} GiB  ratio {row['ratio']:.2f}",
                flush=True,
            )
    from flowpost.core.io import write_json_atomic

    write_json_atomic(args.workspace / "preflight_vs_measured.json", {"resolution": args.resolution, "rows": rows})


if __name__ == "__main__":
    main()
