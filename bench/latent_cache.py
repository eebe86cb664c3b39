"""What the latent cache saves: SFT training throughput reading cached VAE latents against encoding
every batch's images with the VAE at every step.

    python bench/latent_cache.py [--workspace bench-ws] [--steps 12] [--rounds 4] [--batch-size 16] [--records 64]

The model is the sd3 family on the tests' tiny random SD3 pipeline (``tests/tiny_sd3_pipeline.py``)
whose VAE is replaced (``model.components.vae``) by a small AutoencoderKL of SD3's architecture: four
encoder blocks (8x down), two layers each, a quarter of SD3's widths, 16 latent channels; 64x64 RGB
images give 8x8 latents. Both arms are flowpost's SFT trainer on the same demonstrations and condition
cache, differing only in ``data.latents`` (the cache, written once before timing, and its own time and
items/s are reported too). Alternating rounds; medians and the ratio, of wall seconds per step and of
the process's CPU seconds per step (all its threads), which a shared machine's load disturbs less.
Writes ``WORKSPACE/latent_cache.json``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from alternate import Comparison, alternate
from prepared import folder_stage_spec, unit_seconds

from flowpost.core.callbacks.base import Callback
from flowpost.core.config.schema import StageConfig
from flowpost.core.io import write_json_atomic
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.registry import adapter_class
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.condition_cache import update_condition_cache
from flowpost.data.latent_cache import write_latent_cache
from flowpost.data.records import Demonstration
from flowpost.data.shards import write_shards
from flowpost.stage import build_trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_sd3_pipeline import CORPUS, T5_LENGTH, build_tiny_sd3_pipeline  # noqa: E402

IMAGE_SIZE = 64
VAE = {  # SD3's AutoencoderKL layout at a quarter of its widths
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (32, 64, 128, 128),
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "shift_factor": 0.0609,
    "scaling_factor": 1.5305,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}
FINGERPRINT = "bench-sd3-encoders"


class CPUClock(Callback):
    """This process's CPU seconds (all threads) between consecutive optimizer steps."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_step_end(self, trainer: object, metrics: dict[str, float]) -> None:
        self.marks.append(time.process_time())

    def seconds(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.marks, self.marks[1:], strict=False)]


def prepare(root: Path, records: int) -> tuple[dict[str, object], dict[str, float]]:
    """The pipeline folders, demonstrations, condition cache and latent cache under ``root``; the stage's
    model section and the cache's timing."""
    from diffusers import AutoencoderKL

    shutil.rmtree(root, ignore_errors=True)
    pipeline = build_tiny_sd3_pipeline(root / "pipeline")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        AutoencoderKL(**VAE).save_pretrained(root / "vae")
    model = {"family": "sd3", "pretrained": str(pipeline), "components": {"vae": str(root / "vae")}}
    adapter = adapter_class("sd3").from_pipeline(PretrainedSource(str(pipeline), components=model["components"]))
    rng = np.random.default_rng(0)
    demonstrations = [
        Demonstration(
            key=f"r{i}",
            prompt=CORPUS[i % len(CORPUS)],
            image=rng.random((3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32),
        )
        for i in range(records)
    ]
    write_json_atomic(root / "data" / "train" / "manifest.json", write_shards(demonstrations, root / "data" / "train"))
    encode = lambda prompts: adapter.encode_conditions(prompts, max_length=T5_LENGTH)  # noqa: E731
    update_condition_cache(root / "conditions", ["", *CORPUS], encoder_fingerprint=FINGERPRINT, encode=encode)
    started = time.perf_counter()
    write_latent_cache(
        root / "data" / "train",
        root / "latents",
        encode=adapter.encode_output_state,
        codec_fingerprint=adapter.codec_fingerprint(),
        preprocess={"resolution": IMAGE_SIZE, "crop": "center"},
        device=torch.device("cpu"),
    )
    return model, {"cache_seconds": time.perf_counter() - started, "items": records}


def spec(root: Path, model: dict[str, object], out: Path, *, steps: int, batch: int, cached: bool) -> StageSpec:
    """The SFT stage on ``root``'s data, reading its latent cache when ``cached``, writing an emptied ``out``."""
    train = {"lr": 1e-4, "batch_size": batch, "max_steps": steps, "log_every": 1, "checkpoint_every": 0}
    stage = StageConfig.model_validate({"trainer": "sft", "model": model, "train": train})
    return folder_stage_spec(stage, root, out, name="sft", fingerprint=FINGERPRINT, latents=cached)


def compare(root: Path, model: dict[str, object], steps: int, rounds: int, batch: int) -> tuple[Comparison, Comparison]:
    """Wall seconds and CPU seconds per step of both arms, from the same alternating rounds."""
    cpu = Comparison(subject="cached", baseline="encoded", unit="step", seconds={"cached": [], "encoded": []})

    def arm(name: str) -> list[float]:
        out = root / name
        trainer = build_trainer(spec(root, model, out, steps=steps, batch=batch, cached=name == "cached"))
        clock = trainer.callbacks.callbacks.setdefault("cpu_clock", CPUClock())
        trainer.start()
        cpu.seconds[name] += clock.seconds()
        return unit_seconds(out / "events.jsonl")

    wall = alternate(("cached", lambda: arm("cached")), ("encoded", lambda: arm("encoded")), rounds=rounds, unit="step")
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--steps", type=int, default=12, help="SFT optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per arm, alternating")
    parser.add_argument("--batch-size", type=int, default=16, help="SFT batch size (images per step)")
    parser.add_argument("--records", type=int, default=64, help="demonstrations in the dataset")
    args = parser.parse_args(argv)
    root = args.workspace / "latent_cache"
    model, cache = prepare(root, args.records)
    comparison, cpu = compare(root, model, args.steps, args.rounds, args.batch_size)
    print(f"latent cache, wall: {comparison.line(args.batch_size)}", flush=True)
    print(f"latent cache, CPU: {cpu.line(args.batch_size)}", flush=True)
    write_json_atomic(
        args.workspace / "latent_cache.json",
        comparison.summary()
        | {f"cpu_{key}": value for key, value in cpu.summary().items() if key != "unit"}
        | cache
        | {
            "batch_size": args.batch_size,
            "family": "sd3",
            "image_size": IMAGE_SIZE,
            "vae": f"AutoencoderKL {list(VAE['block_out_channels'])} x {VAE['layers_per_block']} layers",
            "seconds": comparison.seconds,
            "cpu_seconds": cpu.seconds,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
