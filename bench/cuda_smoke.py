"""The default pipeline's SFT and GRPO stages and SFT's evaluation in this process, on the visible device.

    python bench/cuda_smoke.py [--workspace bench-ws] [--sft-steps 20] [--grpo-iterations 2]
                               [--eval-samples 100] [--dataset DIR --conditions DIR]
                               [--set stages.sft.train.batch_size=16 ...]

Builds (or reuses) the default pipeline's dataset and MiniLM condition cache in the workspace (or reads
the folders ``--dataset`` and ``--conditions`` name: an ``acquire.digits`` and a ``conditions.minilm``
node's, carried to a machine without the MiniLM package or with other library versions), then
trains each stage from scratch for the given budget, as its process would (``flowpost.stage``) but in
this one, and scores the SFT weights on ``--eval-samples`` held-out prompts. On a GPU it checks what the
CPU-only CI cannot: that every stage trains on the GPU (the trainer's device and its weights'), that
every logged loss is finite, and that the evaluation completes; it reports the median seconds per unit,
the CUDA allocator's peak memory and the metrics. On the CPU it checks the same wiring. Exits 1 naming
the first check that failed. Writes ``WORKSPACE/cuda_smoke.json``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from prepared import bench_pipeline, prepared_run, spec_on, unit_seconds

from flowpost.core.config.schema import PipelineConfig
from flowpost.core.events import read_events
from flowpost.core.io import write_json_atomic
from flowpost.core.trainers.spec import StageSpec
from flowpost.stage import build_trainer
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.evaluate import evaluate_stage

STAGES = ("sft", "grpo")


@dataclass(frozen=True)
class Prepared:
    """The smoke's pipeline and the folders of its dataset and condition cache."""

    pipeline: PipelineConfig
    dataset: Path
    conditions: Path

    def spec(self, name: str, out: Path) -> StageSpec:
        """Stage ``name`` from scratch into an emptied ``out``."""
        return spec_on(self.pipeline, name, out, dataset=self.dataset, conditions=self.conditions)


def train(prepared: Prepared, name: str, out: Path, device: torch.device) -> dict[str, Any]:
    """Stage ``name`` trained into ``out``; its device, unit seconds, peak memory and losses checked."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    trainer = build_trainer(prepared.spec(name, out))
    placed = {p.device.type for p in trainer.adapter.module().parameters()}
    if trainer.accelerator.device.type != device.type or placed != {device.type}:
        raise RuntimeError(f"{name}: trainer on {trainer.accelerator.device}, weights on {placed}; expected {device}")
    started = time.perf_counter()
    progress = trainer.start()
    seconds = time.perf_counter() - started
    losses = [e["metrics"]["loss"] for e in read_events(out / "events.jsonl") if e["event"] == "progress"]
    if not losses or not all(math.isfinite(loss) for loss in losses):
        raise RuntimeError(f"{name}: logged losses {losses} are missing or not all finite")
    units = unit_seconds(out / "events.jsonl")
    return {
        "device": str(trainer.accelerator.device),
        "optimizer_steps": progress.optimizer_step,
        "seconds": seconds,
        "median_unit_s": statistics.median(units) if units else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def evaluate(prepared: Prepared, out: Path, samples: int) -> dict[str, Any]:
    """The SFT weights' metrics on ``samples`` held-out prompts."""
    pipeline = prepared.pipeline
    started = time.perf_counter()
    metrics = evaluate_stage(
        pipeline.evaluate.model_copy(update={"samples": samples}),
        stage="sft",
        rewards=pipeline.stages["sft"].rewards,
        train_dir=out,
        dataset_dir=prepared.dataset,
        conditions_dir=prepared.conditions,
        encoder_fingerprint=encoder_fingerprint(prepared.conditions),
        out_dir=out.parent / "eval-sft",
        seed=pipeline.seed,
    )
    return {"seconds": time.perf_counter() - started, "adherence": metrics["adherence"], "fd": metrics["fd"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--sft-steps", type=int, default=20)
    parser.add_argument("--grpo-iterations", type=int, default=2)
    parser.add_argument("--eval-samples", type=int, default=100)
    parser.add_argument("--dataset", type=Path, help="a finished acquire.digits folder (with --conditions)")
    parser.add_argument("--conditions", type=Path, help="a finished conditions.minilm folder (with --dataset)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="pipeline override (dotted)")
    args = parser.parse_args(argv)
    if args.sft_steps < 2 or args.grpo_iterations < 2 or args.eval_samples < 10:
        parser.error(
            "--sft-steps and --grpo-iterations must be at least 2 (the first is not timed), --eval-samples at least 10"
        )
    if (args.dataset is None) != (args.conditions is None):
        parser.error("give --dataset and --conditions together, or neither")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    budgets = {"sft": args.sft_steps, "grpo": args.grpo_iterations}
    pipeline = bench_pipeline(budgets, args.overrides)
    if args.dataset is not None:
        prepared = Prepared(pipeline, args.dataset, args.conditions)
    else:
        run = prepared_run(args.workspace, pipeline)
        prepared = Prepared(pipeline, run.path("acquire.digits"), run.path("conditions.minilm"))
    root = args.workspace / "cuda_smoke"
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    try:
        for name in STAGES:
            results[name] = train(prepared, name, root / name, device)
            print(f"{name}: {results[name]}", flush=True)
        results["eval_sft"] = evaluate(prepared, root / "sft", args.eval_samples)
        print(f"eval sft: {results['eval_sft']}", flush=True)
    except Exception as error:  # report what ran before the failing check
        results["failed"] = f"{type(error).__name__}: {error}"
        print(f"cuda smoke failed: {results['failed']}", file=sys.stderr, flush=True)
    write_json_atomic(args.workspace / "cuda_smoke.json", results)
    return 1 if "failed" in results else 0


if __name__ == "__main__":
    sys.exit(main())
