"""What flowpost's trainer adds to a step: an SFT step and a GRPO iteration through the stage's
trainer against a minimal hand-written torch loop (``hand_loops.py``) on the same model and batch.

    python bench/core_overhead.py [--workspace bench-ws] [--sft-steps 12] [--grpo-iterations 3] [--rounds 4]
                                  [--set stages.sft.train.batch_size=16 ...]

Both run in this process (same threads), alternating round by round; each round builds a fresh
model and times every unit after its first. Reports the median seconds per unit of each and the
ratio (goal <= 1.05). Writes ``WORKSPACE/core_overhead.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from alternate import Comparison, alternate
from hand_loops import HandGRPO, HandSFT
from prepared import bench_pipeline, fresh_spec, prepared_run, stage_train, unit_seconds

from flowpost.core.io import write_json_atomic
from flowpost.stage import build_trainer


def compare(workspace: Path, name: str, units: int, rounds: int, overrides: list[str]) -> Comparison:
    """Stage ``name`` (sft or grpo) through flowpost against its hand-written loop."""
    run = prepared_run(workspace, bench_pipeline({name: units}, overrides))
    out = workspace / "core_overhead" / name

    def through_flowpost() -> list[float]:
        spec = fresh_spec(run, name, out)
        build_trainer(spec).start()
        return unit_seconds(out / "events.jsonl")

    def by_hand() -> list[float]:
        spec = fresh_spec(run, name, out)
        loop = HandSFT(spec) if name == "sft" else HandGRPO(spec)
        return loop.timed(units)

    unit = "step" if name == "sft" else "iteration"
    return alternate(("flowpost", through_flowpost), ("hand", by_hand), rounds=rounds, unit=unit)


def items_per_unit(name: str, train: dict[str, Any]) -> int:
    return train["batch_size"] if name == "sft" else train["prompts_per_iteration"] * train["group_size"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--sft-steps", type=int, default=12, help="SFT optimizer steps per round")
    parser.add_argument("--grpo-iterations", type=int, default=3, help="GRPO rollout iterations per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per arm, alternating")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="pipeline override (dotted)")
    args = parser.parse_args(argv)
    results = {}
    for name, units in (("sft", args.sft_steps), ("grpo", args.grpo_iterations)):
        comparison = compare(args.workspace, name, units, args.rounds, args.overrides)
        train = stage_train(bench_pipeline({name: units}, args.overrides), name)
        print(f"{name}: {comparison.line(items_per_unit(name, train))} (goal <= 1.05)", flush=True)
        results[name] = comparison.summary() | {
            "items_per_unit": items_per_unit(name, train),
            "seconds": comparison.seconds,
        }
    write_json_atomic(args.workspace / "core_overhead.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
