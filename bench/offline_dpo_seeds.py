"""Offline DPO over several seeds from one SFT stage: sampled pairs, the DPO stage and its judge evaluation.

    python bench/offline_dpo_seeds.py [--workspace bench-ws] [--seeds 0 1 2] [--out DIR]
    python bench/offline_dpo_seeds.py --dataset D --conditions C --sft S --seeds 0   # finished node folders

The default digits pipeline provides the data, the condition cache, the SFT stage (seed 0) and its
evaluation (run once in ``--workspace``, cached on later calls), unless ``--dataset``, ``--conditions``
and ``--sft`` name finished ``acquire.digits``, ``conditions.minilm`` and ``train.sft`` folders and
``--sft-eval`` its ``eval.sft`` folder. For each seed, the ``acquire.pairs`` and ``train.dpo`` nodes of
``examples/digits-offline-dpo.yaml`` run as the pipeline runs them (the seed is the pipeline seed: it
addresses the candidates' noise, the DPO noise and the loader order), then the DPO weights are scored
exactly as ``eval.<stage>`` scores a stage. Prints one row per seed with the node seconds (wall-clock:
run it on an otherwise idle machine) and writes ``OUT/offline_dpo_seeds.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from flowpost.core.config.loading import load_pipeline
from flowpost.core.io import read_json, write_json_atomic
from flowpost.stage import run_stage
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.evaluate import evaluate_stage
from flowpost.tasks.runner import PipelineRun
from flowpost.tasks.sample_pairs import sample_pairs
from flowpost.tasks.train import stage_spec
from flowpost.tasks.weights import stage_weights

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits-offline-dpo.yaml"
UPSTREAM = ("acquire.digits", "conditions.minilm", "train.sft", "eval.sft")
METRICS = ("adherence", "reward_mean", "fd")


def upstream_folders(args: argparse.Namespace) -> dict[str, Path]:
    """The finished data, condition cache, SFT stage and SFT evaluation folders."""
    if args.sft is not None:
        return {
            "acquire.digits": args.dataset,
            "conditions.minilm": args.conditions,
            "train.sft": args.sft,
            "eval.sft": args.sft_eval,
        }
    run = PipelineRun(load_pipeline(None), args.workspace)
    return {node: run.execute(node).path for node in UPSTREAM}


def one_seed(seed: int, folders: dict[str, Path], out: Path) -> dict[str, Any]:
    """Pairs, DPO and evaluation of one pipeline seed; their metrics and seconds."""
    pipeline = load_pipeline(EXAMPLE, [f"seed={seed}"])
    data, cond, sft = folders["acquire.digits"], folders["conditions.minilm"], folders["train.sft"]
    fingerprint = encoder_fingerprint(cond)
    row: dict[str, Any] = {"seed": seed}
    started = time.monotonic()
    sample = pipeline.datasets["pairs"].sample
    assert sample is not None
    pairs = sample_pairs(
        sample,
        dataset="pairs",
        stage_dir=sft,
        prompts_dir=data,
        conditions_dir=cond,
        encoder_fingerprint=fingerprint,
        out_dir=out / "pairs",
        seed=seed,
    )
    row |= {"pairs": pairs["counts"]["train"], "pair_rewards": pairs["rewards"], "pairs_s": time.monotonic() - started}
    started = time.monotonic()
    init = stage_weights(sft, pipeline.stages["dpo"].model.init_weights)[0]
    spec = stage_spec(
        pipeline,
        "dpo",
        out / "dpo",
        dataset_dir=out / "pairs",
        conditions_dir=cond,
        encoder_fingerprint=fingerprint,
        init_from=init,
        resume=False,
    )
    row |= {"step": run_stage(spec).optimizer_step, "dpo_s": time.monotonic() - started}
    started = time.monotonic()
    metrics = evaluate_stage(
        pipeline.evaluate,
        stage="dpo",
        rewards=pipeline.stages["dpo"].rewards,
        train_dir=out / "dpo",
        dataset_dir=data,
        conditions_dir=cond,
        encoder_fingerprint=fingerprint,
        out_dir=out / "eval",
        seed=seed,
    )
    return row | {name: metrics[name] for name in METRICS} | {"eval_s": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None, help="default: WORKSPACE/offline-dpo")
    for name in ("dataset", "conditions", "sft", "sft-eval"):
        parser.add_argument(f"--{name}", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or args.workspace / "offline-dpo"
    folders = upstream_folders(args)
    baseline = read_json(Path(folders["eval.sft"]) / "metrics.json", what="SFT evaluation")
    rows = [one_seed(seed, folders, out / f"seed-{seed}") for seed in args.seeds]
    print("SFT start: " + ", ".join(f"{m} {baseline[m]:.3f}" for m in METRICS))
    for row in rows:
        lift = row["adherence"] - baseline["adherence"]
        print(
            f"seed {row['seed']}: {', '.join(f'{m} {row[m]:.3f}' for m in METRICS)} (adherence {lift:+.3f}); "
            f"{row['pairs']} pairs in {row['pairs_s']:.0f} s, dpo {row['step']} steps in {row['dpo_s']:.0f} s, "
            f"eval {row['eval_s']:.0f} s"
        )
    write_json_atomic(out / "offline_dpo_seeds.json", {"sft": {m: baseline[m] for m in METRICS}, "seeds": rows})


if __name__ == "__main__":
    main()
