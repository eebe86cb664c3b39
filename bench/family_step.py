"""What flowpost's trainer adds to a real family's step: the SFT stage's trainer step against a bare
loop written directly against diffusers (``bare_family_loops.py``), for each pipeline family.

    python bench/family_step.py [--workspace bench-ws] [--families sd3 flux1 qwen-image wan2] [--steps 12]
                                [--rounds 4] [--batch-size 8] [--records 32] [--threads 1]

Each family runs on the tests' tiny random pipeline (``tests/tiny_<family>_pipeline.py``) saved as a
diffusers folder, with demonstrations of its media (RGB images; wan2: clips) and its own encoded
condition cache. Both arms fine-tune the whole transformer from the folder's weights with AdamW on
the same batches, encoding each batch with the VAE (a step: VAE encode, forward with the family's
conditioning, flow-matching loss, backward, optimizer step). Before timing, one step of each arm on
the same first batch, with flowpost's addressed noise, must give the same loss (within 1e-5): the two
compare the same math. Then alternating rounds; each builds fresh models and times every step after
its first. Reports the median wall seconds per step of each and the ratio (goal <= 1.05), and the
same of the process's CPU seconds, which a shared machine's load disturbs less. Torch runs on
``--threads`` threads (1 by default: on these tiny models more threads only add waiting, which on a
loaded machine swamps the step). Writes ``WORKSPACE/family_step.json``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from alternate import Comparison, alternate
from bare_family_loops import BareFamilyStep, SFTSettings
from latent_cache import CPUClock
from prepared import folder_stage_spec, unit_seconds
from torch import Tensor

from flowpost.core.config.schema import StageConfig
from flowpost.core.events import read_events
from flowpost.core.io import write_json_atomic
from flowpost.core.noise import addressed_rand, addressed_randn
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.condition_cache import update_condition_cache
from flowpost.data.records import Demonstration
from flowpost.data.shards import write_shards
from flowpost.stage import build_trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tiny_flux1_pipeline as flux1  # noqa: E402
import tiny_qwen_image_pipeline as qwen_image  # noqa: E402
import tiny_sd3_pipeline as sd3  # noqa: E402
import tiny_wan2_pipeline as wan2  # noqa: E402

FINGERPRINT = "bench-family-encoders"
STAGE = "sft"
SEED = 0
LR = 1e-4
LOSS_TOLERANCE = 1e-5


@dataclass(frozen=True)
class TinyFamily:
    """A family's tiny pipeline builder, its adapter loader (which encodes the conditions), the stage's
    ``model.options`` and the shape of one demonstration's media."""

    build: Callable[[Path], Path]
    load: Callable[[Path], Any]
    options: dict[str, Any]
    media: tuple[int, ...]


FAMILIES = {
    "sd3": TinyFamily(sd3.build_tiny_sd3_pipeline, sd3.load_sd3_adapter, {}, (3, 16, 16)),
    "flux1": TinyFamily(
        flux1.build_tiny_flux1_pipeline,
        flux1.load_flux1_adapter,
        {"resolution": flux1.RESOLUTION},
        (3, flux1.RESOLUTION, flux1.RESOLUTION),
    ),
    "qwen-image": TinyFamily(
        qwen_image.build_tiny_qwen_image_pipeline,
        qwen_image.load_qwen_image_adapter,
        {"resolution": qwen_image.RESOLUTION},
        (3, qwen_image.RESOLUTION, qwen_image.RESOLUTION),
    ),
    "wan2": TinyFamily(
        wan2.build_tiny_wan2_pipeline,
        wan2.load_wan2_adapter,
        {"height": wan2.HEIGHT, "width": wan2.WIDTH, "num_frames": wan2.FRAMES},
        (3, wan2.FRAMES, wan2.HEIGHT, wan2.WIDTH),
    ),
}


def prepare(root: Path, family: str, records: int) -> Path:
    """The family's pipeline folder, demonstrations and condition cache under an emptied ``root``; the folder."""
    tiny = FAMILIES[family]
    shutil.rmtree(root, ignore_errors=True)
    folder = tiny.build(root / "pipeline")
    rng = np.random.default_rng(0)
    demonstrations = [
        Demonstration(key=f"r{i}", prompt=prompt, image=rng.random(tiny.media, dtype=np.float32))
        for i, prompt in enumerate(sd3.CORPUS[i % len(sd3.CORPUS)] for i in range(records))
    ]
    write_json_atomic(root / "data" / "train" / "manifest.json", write_shards(demonstrations, root / "data" / "train"))
    encode = tiny.load(folder).encode_conditions
    update_condition_cache(root / "conditions", ["", *sd3.CORPUS], encoder_fingerprint=FINGERPRINT, encode=encode)
    return folder


def stage_spec(root: Path, family: str, out: Path, *, steps: int, batch: int) -> StageSpec:
    """The SFT stage of ``family`` on ``root``'s data (full fine-tuning), writing an emptied ``out``."""
    model = {"family": family, "pretrained": str(root / "pipeline"), "options": FAMILIES[family].options}
    train = {"lr": LR, "batch_size": batch, "max_steps": steps, "log_every": 1, "checkpoint_every": 0}
    stage = StageConfig.model_validate({"trainer": "sft", "model": model, "train": train})
    return folder_stage_spec(stage, root, out, name=STAGE, fingerprint=FINGERPRINT, seed=SEED)


def settings(spec: StageSpec) -> SFTSettings:
    """The bare step's values from the stage's validated ``train:`` section."""
    train = StageConfig.model_validate(spec.config).arguments()
    names = ("lr", "batch_size", "logit_mean", "logit_std", "cfg_dropout", "weight_decay", "adam_betas")
    return SFTSettings(**{name: getattr(train, name) for name in names})


def addressed_draws(step: int, shape: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """The noise, sigma normals and dropout uniforms flowpost's SFT step ``step`` draws for ``shape``."""
    address = {"seed": SEED, "stage": STAGE, "step": step, "indices": range(shape[0])}
    return (
        addressed_randn(shape[1:], purpose="noise", **address),
        addressed_randn((), purpose="sigma", **address),
        addressed_rand((), purpose="cfg-dropout", **address),
    )


def first_losses(root: Path, family: str, batch: int) -> tuple[float, float]:
    """The loss of the first step of flowpost's trainer and of the bare loop, on the same batch and noise."""
    out = root / "first-step"
    spec = stage_spec(root, family, out, steps=1, batch=batch)
    build_trainer(spec).start()
    flowpost = next(float(e["metrics"]["loss"]) for e in read_events(out / "events.jsonl") if e["event"] == "progress")
    bare = BareFamilyStep(family, root / "pipeline", spec, settings(spec), draws=addressed_draws).step()
    return flowpost, bare


def check_same_loss(family: str, flowpost: float, bare: float) -> None:
    if abs(flowpost - bare) > LOSS_TOLERANCE:
        raise RuntimeError(
            f"{family}: flowpost's first SFT step has loss {flowpost!r}, the bare diffusers loop {bare!r} "
            f"(more than {LOSS_TOLERANCE} apart): the arms do not compute the same step; fix the bare loop's "
            "call or flowpost's adapter before comparing times"
        )


def compare(root: Path, family: str, steps: int, rounds: int, batch: int) -> tuple[Comparison, Comparison]:
    """Wall and CPU seconds per step of family ``family``'s SFT step through flowpost and of the bare
    loop, from the same alternating rounds."""
    out = root / "flowpost"
    cpu = Comparison(subject="flowpost", baseline="bare", unit="step", seconds={"flowpost": [], "bare": []})

    def through_flowpost() -> list[float]:
        trainer = build_trainer(stage_spec(root, family, out, steps=steps, batch=batch))
        clock = trainer.callbacks.callbacks.setdefault("cpu_clock", CPUClock())
        trainer.start()
        cpu.seconds["flowpost"] += clock.seconds()
        return unit_seconds(out / "events.jsonl")

    def bare() -> list[float]:
        spec = stage_spec(root, family, root / "bare", steps=steps, batch=batch)
        loop = BareFamilyStep(family, root / "pipeline", spec, settings(spec))
        seconds = loop.timed(steps)
        cpu.seconds["bare"] += loop.cpu_seconds
        return seconds

    wall = alternate(("flowpost", through_flowpost), ("bare", bare), rounds=rounds, unit="step")
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--steps", type=int, default=12, help="SFT optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per arm, alternating")
    parser.add_argument("--batch-size", type=int, default=8, help="SFT batch size (demonstrations per step)")
    parser.add_argument("--records", type=int, default=32, help="demonstrations in each family's dataset")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads while measuring")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.rounds < 1 or args.threads < 1:
        parser.error("--steps must be at least 2 (a round's first step is not timed); --rounds, --threads at least 1")
    if args.records < args.batch_size:
        parser.error(f"--records {args.records} gives no batch of --batch-size {args.batch_size}; raise --records")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        results = {family: measure(args.workspace, family, args) for family in args.families}
    finally:
        torch.set_num_threads(threads)
    write_json_atomic(args.workspace / "family_step.json", results)
    return 0


def measure(workspace: Path, family: str, args: argparse.Namespace) -> dict[str, Any]:
    """Prepare ``family``, check both arms' first loss, compare their steps; its JSON entry."""
    root = workspace / "family_step" / family
    prepare(root, family, args.records)
    flowpost_loss, bare_loss = first_losses(root, family, args.batch_size)
    check_same_loss(family, flowpost_loss, bare_loss)
    wall, cpu = compare(root, family, args.steps, args.rounds, args.batch_size)
    print(f"{family}, wall: {wall.line(args.batch_size)} (goal <= 1.05)", flush=True)
    print(f"{family}, CPU: {cpu.line(args.batch_size)}", flush=True)
    return (
        wall.summary()
        | {f"cpu_{key}": value for key, value in cpu.summary().items() if key != "unit"}
        | {
            "batch_size": args.batch_size,
            "threads": args.threads,
            "first_loss": {"flowpost": flowpost_loss, "bare": bare_loss},
            "seconds": wall.seconds,
            "cpu_seconds": cpu.seconds,
        }
    )


if __name__ == "__main__":
    sys.exit(main())
