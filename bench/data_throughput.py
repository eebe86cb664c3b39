"""Whether the loader keeps up: the demonstration loader's batches per second against the SFT
trainer's optimizer steps per second on the same batch size (items/s both); and how fast acquisition
turns captioned images into shards (items/s of an image-folder, a table and webdataset shards).

    python bench/data_throughput.py [--workspace bench-ws] [--batches 40] [--steps 12] [--rounds 4]
        [--items 200] [--set ...]

The loader arm opens the stage's loader (shards read and hash-checked, outside the timing) and
times each of ``--batches`` collated batches; the training arm runs the default pipeline's SFT
stage through flowpost's trainer (which reads the same loader) and times each step. Alternating
rounds. The ratio is loader seconds per batch over training seconds per step: the share of a step
the loader would take if it ran serially (far below 1: never the bottleneck). Writes
``WORKSPACE/data_throughput.json``.

The acquisition arm writes ``--items`` random 64x64 RGB PNGs in each layout (``media_sources.py``) and
times the ``acquire.<dataset>`` node's function on each (decode, resize, crop, shard writing and
hashing), ``--rounds`` times in turn; medians per source.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

from alternate import Comparison, alternate
from media_sources import WRITERS
from prepared import bench_pipeline, fresh_spec, prepared_run, unit_seconds

from flowpost.core.config.schema import DatasetConfig
from flowpost.core.io import write_json_atomic
from flowpost.data.stage_inputs import load_stage_inputs
from flowpost.stage import build_trainer
from flowpost.tasks.acquire import acquire_dataset


def compare(workspace: Path, batches: int, steps: int, rounds: int, overrides: list[str]) -> tuple[Comparison, int]:
    pipeline = bench_pipeline({"sft": steps}, overrides)
    run = prepared_run(workspace, pipeline)
    batch_size = pipeline.stages["sft"].train["batch_size"]
    out = workspace / "data_throughput"

    def loader() -> list[float]:
        spec = fresh_spec(run, "sft", out)
        opened = load_stage_inputs(spec).demonstrations(global_batch_size=batch_size, seed=spec.seed)
        seconds, epoch = [], 0
        while len(seconds) < batches:
            iterator = opened.iter_epoch(epoch)
            while len(seconds) < batches:
                start = time.perf_counter()
                if next(iterator, None) is None:
                    break
                seconds.append(time.perf_counter() - start)
            epoch += 1
        return seconds

    def training() -> list[float]:
        spec = fresh_spec(run, "sft", out)
        build_trainer(spec).start()
        return unit_seconds(out / "events.jsonl")

    return alternate(("loader", loader), ("training", training), rounds=rounds, unit="batch"), batch_size


def acquisition(workspace: Path, items: int, rounds: int) -> dict[str, dict[str, float]]:
    """Source -> median seconds and items/s of acquiring ``items`` images, over ``rounds`` rounds in turn."""
    root = workspace / "acquisition"
    shutil.rmtree(root, ignore_errors=True)
    configs = {name: DatasetConfig.model_validate(write(root / name, items, 64)) for name, write in WRITERS.items()}
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, config in configs.items():
            out = root / f"{name}-acquired"
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            counts = acquire_dataset(config, out, where=f"datasets.{name}")["counts"]
            seconds[name].append(time.perf_counter() - start)
            assert counts["train"] + counts["eval"] == items, counts
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    return {name: {"median_s": m, "items_per_s": items / m, "items": items} for name, m in medians.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--batches", type=int, default=40, help="loader batches timed per round")
    parser.add_argument("--steps", type=int, default=12, help="SFT optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per arm, alternating")
    parser.add_argument("--items", type=int, default=200, help="images per source the acquisition arm acquires")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="pipeline override (dotted)")
    args = parser.parse_args(argv)
    comparison, batch_size = compare(args.workspace, args.batches, args.steps, args.rounds, args.overrides)
    print(f"data: {comparison.line(batch_size)}", flush=True)
    acquired = acquisition(args.workspace, args.items, args.rounds)
    for name, result in acquired.items():
        print(f"acquisition {name}: {result['items_per_s']:.1f} items/s ({args.items} items)", flush=True)
    write_json_atomic(
        args.workspace / "data_throughput.json",
        comparison.summary() | {"batch_size": batch_size, "seconds": comparison.seconds, "acquisition": acquired},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
