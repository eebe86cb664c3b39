"""A LoRA GRPO stage over a quantized frozen base (``model.quantize``: none, int8, fp8) on the default digits
pipeline's tiny family, and the memory preflight of the published shapes with and without an int8 base.

    python bench/quantized_base.py [--workspace bench-ws] [--sft-steps 150] [--iterations 8] [--rank 8] [--set K=V]

The default pipeline's data and condition cache are built (or reused) in ``--workspace``; its SFT stage trains
from scratch for ``--sft-steps`` steps (0: none), and its GRPO stage (the default settings with the ``--set``
overrides, e.g. ``stages.grpo.train.group_size=4``; LoRA of ``--rank``) starts from those EMA weights (or its
seeded initial weights) once per setting, with the same seed. Per setting: the replay ratio at the first replay (the
``check-consistency`` diagnostic on a trainer of its own: rollout and replay must run the same quantized base),
then ``--iterations`` iterations: the reward mean and the clip fraction (the share of replayed ratios outside
1 ± clip_range) of each, and the stage seconds. Last, the preflight's GiB per GPU for the LoRA r32 GRPO stages
of ``docs/shapes/memory_table.py`` (FLUX.1-dev and Qwen-Image at 512 px among them). Writes
``WORKSPACE/quantized_base.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from prepared import bench_pipeline, prepared_run

from flowpost.core.config.loading import pipeline_to_dict, validate_pipeline
from flowpost.core.diagnostics import check_consistency
from flowpost.core.events import read_events
from flowpost.core.io import write_json_atomic
from flowpost.core.memory import GIB
from flowpost.stage import build_trainer, run_stage
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.runner import PipelineRun
from flowpost.tasks.train import stage_spec

KINDS = ("none", "int8", "fp8")
SHAPES_TABLE = Path(__file__).resolve().parents[1] / "docs" / "shapes" / "memory_table.py"


def grpo_spec(run: PipelineRun, kind: str, out: Path, *, rank: int, sft: Path | None, iterations: int) -> Any:
    """The GRPO stage with LoRA of ``rank`` over a ``kind`` base, from the SFT stage's EMA weights (or scratch)."""
    data = pipeline_to_dict(run.pipeline)
    data["stages"]["grpo"]["model"].update(lora={"rank": rank}, quantize=kind)
    data["stages"]["grpo"]["train"]["iterations"] = iterations
    pipeline = validate_pipeline(data, source="bench pipeline")
    conditions = run.path("conditions.minilm")
    return stage_spec(
        pipeline,
        "grpo",
        out,
        dataset_dir=run.path("acquire.digits"),
        conditions_dir=conditions,
        encoder_fingerprint=encoder_fingerprint(conditions),
        init_from=None if sft is None else sft / "final" / "ema",
        resume=False,
    )


def measure(run: PipelineRun, kind: str, root: Path, *, rank: int, sft: Path | None, iterations: int) -> dict[str, Any]:
    """The first replay's ratio and ``iterations`` iterations' rewards and clip fractions over a ``kind`` base."""
    check = check_consistency(
        build_trainer(grpo_spec(run, kind, root / f"check-{kind}", rank=rank, sft=sft, iterations=1))
    )
    spec = grpo_spec(run, kind, root / f"grpo-{kind}", rank=rank, sft=sft, iterations=iterations)
    started = time.perf_counter()
    run_stage(spec)
    seconds = time.perf_counter() - started
    steps = [e["metrics"] for e in read_events(Path(spec.output_dir) / "events.jsonl") if e["event"] == "progress"]
    return {
        "quantize": kind,
        "first_replay_max_abs_ratio_error": check["max_abs_ratio_error"],
        "first_replay_ok": check["ok"],
        "reward_mean": [float(m["reward/total_mean"]) for m in steps],
        "clip_fraction": [float(m["clip_fraction"]) for m in steps],
        "kl": [float(m["kl"]) for m in steps],
        "seconds": seconds,
    }


def preflight_rows() -> list[dict[str, Any]]:
    """The published shapes' LoRA r32 GRPO estimates (one GPU) with and without an int8 base."""
    spec = importlib.util.spec_from_file_location("memory_table", SHAPES_TABLE)
    assert spec is not None and spec.loader is not None
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    from flowpost.tasks.preflight import stage_memory

    with tempfile.TemporaryDirectory() as folder:
        prompts = Path(folder) / "prompts.txt"
        prompts.write_text("a photo of a cat\n")
        rows = stage_memory(validate_pipeline(table.pipeline(prompts, 1)))
    return [
        {"stage": row.stage, "fine_tune": row.fine_tune, "gib_per_gpu": row.estimate.total / GIB}
        for row in rows
        if row.estimate is not None and row.fine_tune != "full"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--set", action="append", default=[], dest="overrides", help="a dotted pipeline override")
    args = parser.parse_args()
    root = args.workspace / "quantized-base"
    budgets = {"sft": max(args.sft_steps, 1), "grpo": args.iterations}
    run = prepared_run(args.workspace, bench_pipeline(budgets, args.overrides))
    sft = root / f"sft-{args.sft_steps}" if args.sft_steps else None
    if sft is not None and not (sft / "final" / "ema").is_dir():
        conditions = run.path("conditions.minilm")
        run_stage(
            stage_spec(
                run.pipeline,
                "sft",
                sft,
                dataset_dir=run.path("acquire.digits"),
                conditions_dir=conditions,
                encoder_fingerprint=encoder_fingerprint(conditions),
                init_from=None,
                resume=False,
            )
        )
    results = [measure(run, kind, root, rank=args.rank, sft=sft, iterations=args.iterations) for kind in KINDS]
    memory = preflight_rows()
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    write_json_atomic(
        args.workspace / "quantized_base.json", {"settings": settings, "grpo": results, "preflight": memory}
    )
    for r in results:
        curve = " ".join(f"{v:.4f}" for v in r["reward_mean"])
        print(
            f"{r['quantize']:>5}: first replay |ratio-1| max {r['first_replay_max_abs_ratio_error']:.2e}; "
            f"clip fraction mean {statistics.fmean(r['clip_fraction']):.3f}; {r['seconds']:.0f} s; reward {curve}"
        )
    for row in memory:
        print(f"{row['stage']:>16} {row['fine_tune']:<22} {row['gib_per_gpu']:.1f} GiB")


if __name__ == "__main__":
    main()
