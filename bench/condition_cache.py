"""What the condition cache saves: SFT training throughput with cached MiniLM embeddings against
encoding every batch's prompts with MiniLM at every step.

    python bench/condition_cache.py [--workspace bench-ws] [--steps 12] [--rounds 4] [--set KEY=VALUE ...]

Both arms are the hand-written SFT loop of ``hand_loops.py`` on the default pipeline's model and
batch, differing only in where a batch's conditions come from (the ``conditions.minilm`` cache, or
the encoder, loaded once before timing). Alternating rounds; medians and the ratio. Writes
``WORKSPACE/condition_cache.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alternate import Comparison, alternate
from hand_loops import HandSFT
from prepared import bench_pipeline, fresh_spec, prepared_run

from flowpost.core.io import write_json_atomic
from flowpost.core.models.text_encoders import build_encoder


def compare(workspace: Path, steps: int, rounds: int, overrides: list[str]) -> Comparison:
    pipeline = bench_pipeline({"sft": steps}, overrides)
    run = prepared_run(workspace, pipeline)
    encoder = build_encoder("minilm", max_length=pipeline.conditions["minilm"].max_length)
    encoder.encode(["warm-up"])
    out = workspace / "condition_cache"

    def cached() -> list[float]:
        return HandSFT(fresh_spec(run, "sft", out)).timed(steps)

    def encoded() -> list[float]:
        return HandSFT(fresh_spec(run, "sft", out), encode=encoder.encode).timed(steps)

    return alternate(("cached", cached), ("encoded", encoded), rounds=rounds, unit="step")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--steps", type=int, default=12, help="SFT optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per arm, alternating")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="pipeline override (dotted)")
    args = parser.parse_args(argv)
    comparison = compare(args.workspace, args.steps, args.rounds, args.overrides)
    batch = bench_pipeline({"sft": args.steps}, args.overrides).stages["sft"].train["batch_size"]
    print(f"condition cache: {comparison.line(batch)}", flush=True)
    write_json_atomic(
        args.workspace / "condition_cache.json",
        comparison.summary() | {"batch_size": batch, "seconds": comparison.seconds},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
