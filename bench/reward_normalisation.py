"""Two rewards of very different spreads in one GRPO stage: ``train.reward_normalisation: sum`` against
``per_reward`` (GDPO).

    python bench/reward_normalisation.py [--workspace bench-ws] [--rewards A B] [--seeds 0 1 2]
                                         [--iterations 12] [--samples 300] [--out DIR]
    python bench/reward_normalisation.py --dataset D --conditions C --sft S   # finished node folders

The default digits pipeline provides the data, the condition cache and the SFT stage (run once in
``--workspace``, cached on later calls) unless ``--dataset``, ``--conditions`` and ``--sft`` name finished
``acquire.digits``, ``conditions.minilm`` and ``train.sft`` folders. Its GRPO stage (the default pipeline's
settings) is then rewarded by the two ``--rewards``, both of weight 1 (default: ``digit_adherence``, the
reward classifier's probability of the prompted digit, whose samples of one prompt differ by tenths, and
``mean_brightness``, whose samples differ by hundredths), for ``--iterations`` iterations under each setting
and pipeline seed, from the same SFT weights. The SFT start and each stage's EMA weights are scored on the
same held-out samples (20 ODE steps, the same noise) with both rewards and the judge's adherence. Prints each
value's start -> end per run, each reward's std over the first iteration's samples and its mean
``advantage/<name>_corr`` over the iterations (how much it steered the updates), with the stage seconds;
writes ``OUT/reward_normalisation.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from flowpost.core.config.loading import load_pipeline
from flowpost.core.config.schema import EvaluateConfig
from flowpost.core.events import read_events
from flowpost.core.io import write_json_atomic
from flowpost.stage import run_stage
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.evaluate import evaluate_stage
from flowpost.tasks.runner import PipelineRun
from flowpost.tasks.train import stage_spec
from flowpost.tasks.weights import stage_weights

DEFAULT_REWARDS = ("digit_adherence", "mean_brightness")
JUDGE = "adherence"  # scored beside both rewards; no stage trains on it
SETTINGS = ("sum", "per_reward")
UPSTREAM = ("acquire.digits", "conditions.minilm", "train.sft")


def upstream_folders(args: argparse.Namespace) -> dict[str, Path]:
    """The finished data, condition cache and SFT stage folders."""
    if args.sft is not None:
        return {"acquire.digits": args.dataset, "conditions.minilm": args.conditions, "train.sft": args.sft}
    run = PipelineRun(load_pipeline(None), args.workspace)
    return {node: run.execute(node).path for node in UPSTREAM}


def score(
    stage: str, train_dir: Path, folders: dict[str, Path], out: Path, samples: int, scores: tuple[str, ...]
) -> dict[str, float]:
    """``scores`` (both rewards and the judge's adherence) on the held-out samples of ``train_dir``'s EMA weights."""
    config = EvaluateConfig.model_validate(
        {"metrics": list(scores), "samples": samples, "steps": 20, "seed": 1234, "batch_size": samples}
    )
    result = evaluate_stage(
        config,
        stage=stage,
        rewards=[],
        train_dir=train_dir,
        dataset_dir=folders["acquire.digits"],
        conditions_dir=folders["conditions.minilm"],
        encoder_fingerprint=encoder_fingerprint(folders["conditions.minilm"]),
        out_dir=out,
        seed=0,
    )
    return {name: result[name] for name in scores}


def train(
    setting: str, rewards: tuple[str, ...], seed: int, iterations: int, folders: dict[str, Path], out: Path
) -> dict[str, Any]:
    """The default GRPO stage on ``rewards`` under ``setting``; its seconds and per-reward statistics."""
    listed = ", ".join(f"{{name: {name}}}" for name in rewards)
    pipeline = load_pipeline(
        None,
        [
            f"seed={seed}",
            f"stages.grpo.rewards=[{listed}]",
            f"stages.grpo.train.iterations={iterations}",
            f"stages.grpo.train.reward_normalisation={setting}",
            "stages.grpo.train.checkpoint_every=0",
            "stages.grpo.callbacks.trackers=[]",
        ],
    )
    spec = stage_spec(
        pipeline,
        "grpo",
        out,
        dataset_dir=folders["acquire.digits"],
        conditions_dir=folders["conditions.minilm"],
        encoder_fingerprint=encoder_fingerprint(folders["conditions.minilm"]),
        init_from=stage_weights(folders["train.sft"], pipeline.stages["grpo"].model.init_weights)[0],
        resume=False,
    )
    started = time.monotonic()
    run_stage(spec)
    seconds = time.monotonic() - started
    steps = [event["metrics"] for event in read_events(out / "events.jsonl") if event["event"] == "progress"]
    return {
        "seconds": seconds,
        "spread": {name: steps[0][f"reward/{name}_std"] for name in rewards},
        "steering": {name: statistics.fmean(m[f"advantage/{name}_corr"] for m in steps) for name in rewards},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--rewards", nargs=2, default=list(DEFAULT_REWARDS), help="the two rewards, weight 1 each")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="the pipeline seed of each pair of stages")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--samples", type=int, default=300, help="held-out samples scored per model")
    parser.add_argument("--out", type=Path, default=None, help="default: WORKSPACE/reward-normalisation")
    for name in ("dataset", "conditions", "sft"):
        parser.add_argument(f"--{name}", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or args.workspace / "reward-normalisation"
    rewards = tuple(args.rewards)
    scores = (*rewards, JUDGE)
    folders = upstream_folders(args)
    start = score("sft", folders["train.sft"], folders, out / "eval-sft", args.samples, scores)
    rows = {}
    for seed in args.seeds:
        for setting in SETTINGS:
            run = f"{setting}-seed{seed}"
            stats = train(setting, rewards, seed, args.iterations, folders, out / run)
            end = score("grpo", out / run, folders, out / f"eval-{run}", args.samples, scores)
            rows[run] = stats | {"end": end}
    print(f"{args.iterations} GRPO iterations from SFT, {args.samples} held-out samples scored per model")
    for run, row in rows.items():
        moves = ", ".join(f"{name} {start[name]:.4f} -> {row['end'][name]:.4f}" for name in scores)
        spread = ", ".join(f"{name} {row['spread'][name]:.4f}" for name in rewards)
        steer = ", ".join(f"{name} {row['steering'][name]:+.2f}" for name in rewards)
        print(f"{run}: {moves}; first-iteration std {spread}; steering {steer}; {row['seconds']:.0f} s")
    summary = {"iterations": args.iterations, "rewards": rewards, "start": start, **rows}
    write_json_atomic(out / "reward_normalisation.json", summary)


if __name__ == "__main__":
    main()
