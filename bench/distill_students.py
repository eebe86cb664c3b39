"""A distillation example's student stage from one SFT stage, evaluated at several step counts.

    python bench/distill_students.py examples/digits-tdm.yaml [--set stages.tdm.train.iterations=20] [--steps 4 2]
    python bench/distill_students.py examples/digits-kd.yaml --dataset D --conditions C --sft S  # finished folders

The default digits pipeline provides the data, the condition cache and the SFT stage (run once in
``--workspace``, cached on later calls; the examples' SFT stage is the default pipeline's, bit for bit),
unless ``--dataset``, ``--conditions`` and ``--sft`` name finished ``acquire.digits``,
``conditions.minilm`` and ``train.sft`` folders. The example's student stage (the last one) runs as the
pipeline runs it, after its ``teacher-trajectories`` dataset when it reads one; its weights are then
scored as ``eval.<stage>`` scores a stage, once per ``--steps`` value. Prints the metrics, the node
seconds (wall-clock) and the load average at their start and end, and writes ``OUT/<stage>.json``
(``OUT`` starts over on every call).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

from flowpost.core.config.loading import load_pipeline
from flowpost.core.config.schema import PipelineConfig
from flowpost.core.io import write_json_atomic
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.evaluate import evaluate_stage
from flowpost.tasks.runner import PipelineRun
from flowpost.tasks.train import run_training, stage_spec
from flowpost.tasks.trajectories import acquire_trajectories
from flowpost.tasks.weights import stage_weights

UPSTREAM = ("acquire.digits", "conditions.minilm", "train.sft")
METRICS = ("adherence", "reward_mean", "fd")


def upstream_folders(args: argparse.Namespace) -> dict[str, Path]:
    """The finished data, condition cache and SFT stage folders."""
    if args.sft is not None:
        return {"acquire.digits": args.dataset, "conditions.minilm": args.conditions, "train.sft": args.sft}
    run = PipelineRun(load_pipeline(None), args.workspace)
    return {node: run.execute(node).path for node in UPSTREAM}


def timed(row: dict[str, Any], name: str, started: float, load: float) -> None:
    """Record ``name``'s seconds since ``started`` and the 1-minute load average then and now."""
    row[f"{name}_s"] = round(time.monotonic() - started, 1)
    row[f"{name}_load"] = [round(load, 1), round(os.getloadavg()[0], 1)]


def student_data(pipeline: PipelineConfig, stage: str, folders: dict[str, Path], out: Path, row: dict) -> Path:
    """The folder the stage trains on: the digits data, or its teacher trajectories sampled into ``out``."""
    data = pipeline.stages[stage].data
    assert data is not None  # every distillation example names its data
    trajectories = getattr(pipeline.datasets[data.dataset], "trajectories", None)  # only sampled datasets have it
    if trajectories is None:
        return folders["acquire.digits"]
    cond = folders["conditions.minilm"]
    started, load = time.monotonic(), os.getloadavg()[0]
    acquire_trajectories(
        trajectories,
        out / data.dataset,
        dataset=data.dataset,
        weights_dir=stage_weights(folders[f"train.{trajectories.stage}"], trajectories.weights)[0],
        prompts_dir=folders["acquire.digits"],
        conditions_dir=cond,
        encoder_fingerprint=encoder_fingerprint(cond),
        seed=pipeline.seed,
        smoke=pipeline.smoke,
    )
    timed(row, f"acquire_{data.dataset}", started, load)
    return out / data.dataset


def student(pipeline: PipelineConfig, folders: dict[str, Path], out: Path, steps: list[int]) -> dict[str, Any]:
    """Train the example's last stage, then evaluate it at each of ``steps``; its metrics and seconds."""
    stage = list(pipeline.stages)[-1]
    cond = folders["conditions.minilm"]
    row: dict[str, Any] = {"stage": stage}
    dataset_dir = student_data(pipeline, stage, folders, out, row)
    init = stage_weights(folders["train.sft"], pipeline.stages[stage].model.init_weights)[0]
    spec = stage_spec(
        pipeline,
        stage,
        out / stage,
        dataset_dir=dataset_dir,
        conditions_dir=cond,
        encoder_fingerprint=encoder_fingerprint(cond),
        init_from=init,
        resume=False,
    )
    started, load = time.monotonic(), os.getloadavg()[0]
    row["step"] = run_training(spec).step
    timed(row, "train", started, load)
    for count in steps:
        started, load = time.monotonic(), os.getloadavg()[0]
        metrics = evaluate_stage(
            pipeline.evaluate.model_copy(update={"steps": count}),
            stage=stage,
            rewards=pipeline.stages[stage].rewards,
            train_dir=out / stage,
            dataset_dir=folders["acquire.digits"],
            conditions_dir=cond,
            encoder_fingerprint=encoder_fingerprint(cond),
            out_dir=out / f"eval-{count}",
            seed=pipeline.seed,
            smoke=pipeline.smoke,
        )
        row[f"steps_{count}"] = {name: metrics[name] for name in METRICS}
        timed(row, f"eval_{count}", started, load)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("example", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="dotted override, repeatable")
    parser.add_argument("--steps", type=int, nargs="+", default=[4], help="evaluation step counts")
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--out", type=Path, default=None, help="default: WORKSPACE/distill/<example name>")
    for name in ("dataset", "conditions", "sft"):
        parser.add_argument(f"--{name}", type=Path, default=None)
    args = parser.parse_args()
    pipeline = load_pipeline(args.example, args.overrides)
    out = args.out or args.workspace / "distill" / args.example.stem
    shutil.rmtree(out, ignore_errors=True)  # a fresh student every call
    row = student(pipeline, upstream_folders(args), out, args.steps) | {"overrides": args.overrides}
    for count in args.steps:
        print(f"{row['stage']} at {count} steps: " + ", ".join(f"{m} {row[f'steps_{count}'][m]:.3f}" for m in METRICS))
    print(", ".join(f"{key} {value}" for key, value in row.items() if key.endswith(("_s", "_load"))))
    write_json_atomic(out / f"{row['stage']}.json", row)


if __name__ == "__main__":
    main()
