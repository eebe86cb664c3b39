"""Data-parallel scaling on this machine: 1 -> N processes, throughput and gradient-sync cost.

    python bench/scaling.py [--workspace bench-ws] [--processes 1 2] [--steps 40] [--trainers sft grpo]
                            [--backends ddp fsdp2 deepspeed-zero2] [--set KEY=VALUE ...]

Runs the default pipeline's stages (real model size and batch sizes) from scratch for a fixed
budget at each process count (global batch unchanged, split across ranks; gloo on CPU) and reads
the stage's step events: samples per second over the steps after the first (startup excluded) and
the mean ``grad_sync_seconds`` of a step (ddp: the one flat all-reduce of the gradients; fsdp2 and
ZeRO-2 communicate inside backward and step, so only their throughput is reported). Writes
``WORKSPACE/scaling.json``. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict, validate_pipeline
from flowpost.core.events import read_events
from flowpost.core.io import write_json_atomic
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.runner import PipelineRun
from flowpost.tasks.train import run_training, stage_spec


def scaled_pipeline(
    trainer_budget: dict[str, int], processes: int, backend: str = "ddp", overrides: list[str] | None = None
) -> Any:
    """The default pipeline (with dotted ``overrides``) with each benchmarked stage from scratch, on
    ``processes`` ranks, no side work."""
    data = pipeline_to_dict(load_pipeline(None, overrides))
    for name, budget in trainer_budget.items():
        stage = data["stages"][name]
        stage["model"] = {**stage["model"], "init": "scratch"}
        key = "max_steps" if name == "sft" else "iterations"
        stage["train"] = {**stage["train"], key: budget, "checkpoint_every": 0, "log_every": 1}
        stage["callbacks"] = {**stage["callbacks"], "trackers": []}
        stage["launch"] = {**stage["launch"], "num_processes": processes, "backend": backend}
    return validate_pipeline(data, source="scaling bench pipeline")


def measure(
    workspace: Path, name: str, budget: int, processes: int, backend: str, overrides: list[str] | None = None
) -> dict[str, Any]:
    """Run one stage and summarise its step events."""
    pipeline = scaled_pipeline({name: budget}, processes, backend, overrides)
    run = PipelineRun(pipeline, workspace)
    for node in ("acquire.digits", "conditions.minilm"):
        run.execute(node)
    out = workspace / "scaling" / f"{name}-{processes}-{backend}"
    spec = stage_spec(
        pipeline,
        name,
        out,
        dataset_dir=run.path("acquire.digits"),
        conditions_dir=run.path("conditions.minilm"),
        encoder_fingerprint=encoder_fingerprint(run.path("conditions.minilm")),
        init_from=None,
        resume=False,
    )
    if out.exists():
        for stale in out.glob("*"):
            if stale.is_file():
                stale.unlink()
    run_training(spec)
    steps = [e for e in read_events(out / "events.jsonl") if e["event"] == "progress"]
    train = pipeline.stages[name].train
    samples_per_unit = train["batch_size"] if name == "sft" else train["prompts_per_iteration"] * train["group_size"]
    seconds = steps[-1]["time"] - steps[0]["time"]
    sync = [e["metrics"]["grad_sync_seconds"] for e in steps if "grad_sync_seconds" in e["metrics"]]
    return {
        "processes": processes,
        "backend": backend if processes > 1 else "-",
        "units": len(steps) - 1,
        "seconds": seconds,
        "samples_per_second": (len(steps) - 1) * samples_per_unit / seconds,
        "grad_sync_seconds": statistics.mean(sync) if sync else 0.0,
        "seconds_per_unit": seconds / (len(steps) - 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=40, help="SFT optimizer steps (GRPO: a tenth, at least 3)")
    parser.add_argument("--trainers", nargs="+", default=["sft", "grpo"], choices=["sft", "grpo"])
    parser.add_argument("--backends", nargs="+", default=["ddp"], choices=["ddp", "fsdp2", "deepspeed-zero2"])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="pipeline override (dotted)")
    args = parser.parse_args(argv)
    budgets = {"sft": args.steps, "grpo": max(3, args.steps // 10)}
    runs = [(n, backend) for n in args.processes for backend in (args.backends if n > 1 else ["ddp"])]
    results: dict[str, list[dict[str, Any]]] = {}
    for name in args.trainers:
        results[name] = [
            measure(args.workspace, name, budgets[name], n, backend, args.overrides) for n, backend in runs
        ]
        base = results[name][0]["samples_per_second"]
        print(f"\n{name}: {budgets[name]} {'steps' if name == 'sft' else 'iterations'}")
        print("processes  backend          samples/s  speedup  s/unit  grad sync s/step")
        for row in results[name]:
            print(
                f"{row['processes']:>9}  {row['backend']:<15}  {row['samples_per_second']:>9.1f}"
                f"  {row['samples_per_second'] / base:>7.2f}"
                f"  {row['seconds_per_unit']:>6.2f}  {row['grad_sync_seconds']:>16.4f}"
            )
    write_json_atomic(args.workspace / "scaling.json", results)
    print(f"\nwrote {args.workspace / 'scaling.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
