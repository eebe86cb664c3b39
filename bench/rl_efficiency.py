"""Judge adherence against rollout iterations and wall-clock for online trainers from one SFT export.

    python bench/rl_efficiency.py [--workspace bench-ws] [--methods grpo nft awm mixgrpo dgpo branchgrpo crd]
        [--seeds 0 1 2]

The default digits pipeline provides the data, the condition cache and the SFT stage (seed 0, run
once, cached on later calls). Each method's stage comes from the default pipeline (``grpo``) or
``examples/digits-<method>.yaml``, runs from the same SFT EMA weights with checkpoints every
``--every`` iterations, and every checkpoint's EMA weights are scored exactly as ``eval.<stage>``
scores a stage (held-out templates, judge classifier). Prints a table per method and a summary;
writes everything to ``WORKSPACE/rl_efficiency.json``. Run it on an otherwise idle machine: the
seconds are wall-clock.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from flowpost.core.checkpoint import load_checkpoint
from flowpost.core.config.loading import load_pipeline, pipeline_to_dict, validate_pipeline
from flowpost.core.config.schema import StageConfig
from flowpost.core.events import Event, ProgressEvent
from flowpost.core.io import read_json, write_json_atomic
from flowpost.stage import build_adapter
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.evaluate import evaluate_stage
from flowpost.tasks.runner import PipelineRun
from flowpost.tasks.train import run_training

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
UPSTREAM = ("acquire.digits", "conditions.minilm", "train.sft", "eval.sft")


def bench_pipeline(methods: list[str], every: int, samples: int, *, smoke: bool) -> Any:
    """The default pipeline plus one stage per method (from the examples), checkpointing every ``every``."""
    data = pipeline_to_dict(load_pipeline(None))
    data["smoke"] = smoke
    for method in methods:
        if method not in data["stages"]:
            example = yaml.safe_load((EXAMPLES / f"digits-{method}.yaml").read_text())
            data["stages"][method] = example["stages"][method]
        data["stages"][method]["train"]["checkpoint_every"] = every
        data["stages"][method]["callbacks"].pop("trackers", None)
    data["evaluate"] = {**data["evaluate"], "after": ["sft"], "samples": samples}
    data["export"] = None
    return validate_pipeline(data, source="bench pipeline")


def checkpoint_weights(spec: Any, checkpoint: Path, out: Path) -> int:
    """Materialise a checkpoint's EMA (else live) weights and progress as ``out/final``; return its iteration."""
    state = load_checkpoint(checkpoint, verified=True)
    adapter = build_adapter(StageConfig.model_validate(spec.config), spec)
    adapter.module().load_state_dict(state.model)
    for name, tensors in state.snapshots.items():
        adapter.snapshots.load_state_dict(name, tensors)
    if "ema" in state.snapshots:
        with adapter.use_snapshot("ema"):
            adapter.save_pretrained(out / "final" / "live")
    else:
        adapter.save_pretrained(out / "final" / "live")
    write_json_atomic(out / "final" / "progress.json", state.trainer["progress"])
    return int(state.trainer["progress"]["rollout_iteration"])


def run_method(run: PipelineRun, method: str, seed: int, out: Path) -> list[dict[str, Any]]:
    """Train ``method`` with ``seed`` into ``out``; score every checkpoint; rows of the curve."""
    spec = dataclasses.replace(run.train_spec(method, out, resume=False), seed=seed)
    times: dict[int, float] = {}
    start = time.time()

    def on_event(event: Event) -> None:
        if isinstance(event, ProgressEvent) and event.time is not None:
            times[event.done] = event.time - start  # keyed by rollout iteration, as the checkpoints are

    run_training(spec, on_event=on_event)
    p = run.pipeline
    cond_dir = run.path(f"conditions.{p.evaluate.conditions}")
    rows = []
    for checkpoint in sorted((out / "checkpoints").glob("step-*"), key=lambda c: int(c.name.split("-")[1])):
        with tempfile.TemporaryDirectory() as tmp:
            iteration = checkpoint_weights(spec, checkpoint, Path(tmp))
            metrics = evaluate_stage(
                p.evaluate.model_copy(update={"weights": "live"}),
                stage=method,
                rewards=p.stages[method].rewards,
                train_dir=Path(tmp),
                dataset_dir=run.path(f"acquire.{p.evaluate.dataset}"),
                conditions_dir=cond_dir,
                encoder_fingerprint=encoder_fingerprint(cond_dir),
                out_dir=out / "eval" / checkpoint.name,
                seed=seed,
            )
        rows.append(
            {
                "iteration": iteration,
                "seconds": round(times.get(iteration, float("nan")), 1),
                "adherence": metrics["adherence"],
                "fd": metrics["fd"],
            }
        )
    return rows


def summarize(results: dict[str, dict[int, list[dict[str, Any]]]], base: dict[str, Any], target: float) -> str:
    """Per method: final adherence and fd over seeds, and iterations / seconds to reach ``target``."""
    lines = [
        f"sft: adherence {base['adherence']:.3f}, fd {base['fd']:.1f}",
        f"{'method':<10} {'final adherence':>22} {'final fd':>16} {f'iters to {target:.2f}':>16} {'s to target':>12}",
    ]
    for method, by_seed in results.items():
        finals = [rows[-1] for rows in by_seed.values()]
        reach = [next((r for r in rows if r["adherence"] >= target), None) for rows in by_seed.values()]
        hit = [r for r in reach if r is not None]
        adherence = [f["adherence"] for f in finals]
        fd = [f["fd"] for f in finals]
        iters = f"{statistics.mean(r['iteration'] for r in hit):.0f} ({len(hit)}/{len(reach)})" if hit else "never"
        secs = f"{statistics.mean(r['seconds'] for r in hit):.0f}" if hit else "-"
        lines.append(
            f"{method:<10} {statistics.mean(adherence):>8.3f} ± {statistics.pstdev(adherence):.3f}"
            f"{'':>6} {statistics.mean(fd):>8.1f} ± {statistics.pstdev(fd):.1f} {iters:>16} {secs:>12}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--methods", nargs="+", default=["grpo", "nft", "awm", "mixgrpo", "dgpo", "branchgrpo", "crd"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--every", type=int, default=5, help="checkpoint (and score) every N iterations")
    parser.add_argument("--samples", type=int, default=500, help="evaluation samples per checkpoint")
    parser.add_argument("--smoke", action="store_true", help="a few steps per stage, to check the wiring")
    parser.add_argument("--target", type=float, default=0.85, help="adherence whose first crossing is timed")
    args = parser.parse_args(argv)

    run = PipelineRun(bench_pipeline(args.methods, args.every, args.samples, smoke=args.smoke), args.workspace)
    for node in UPSTREAM:
        print(f"{node}: {run.execute(node).status}", flush=True)
    base = read_json(run.path("eval.sft") / "metrics.json")
    results: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for method in args.methods:
        for seed in args.seeds:
            rows = run_method(run, method, seed, args.workspace / "rl_efficiency" / method / f"seed-{seed}")
            results.setdefault(method, {})[seed] = rows
            curve = ", ".join(f"{r['iteration']}:{r['adherence']:.3f}@{r['seconds']:.0f}s" for r in rows)
            print(f"{method} seed {seed}: {curve}", flush=True)
    report = summarize(results, base, args.target)
    print(report)
    write_json_atomic(
        args.workspace / "rl_efficiency.json",
        {"sft": {k: base[k] for k in ("adherence", "fd")}, "results": results, "summary": report},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
