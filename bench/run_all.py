"""Run every benchmark and write ``bench/results.md``: flowpost against its baseline, measured in the
same run, alternating, medians and ratios.

    python bench/run_all.py [--quick] [--workspace bench-ws] [--out bench/results.md] [--only NAME ...] [--render]
    make bench            # the same, full profile (make bench-quick: --quick)

The full profile is sized for ten to fifteen minutes on an idle 2-core machine (an estimate from the
default pipeline's step times), once the bench workspace holds the default pipeline's dataset and
condition cache (built on the first run, reused while the code is unchanged); ``--quick`` runs the
default model on an eighth of its batches, to check the wiring. A benchmark that fails is reported
in the results with its error, and the others still run. ``--render`` runs nothing and writes the
results file from the JSON the benchmarks left in the workspace (e.g. ones run one by one).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import condition_cache
import core_overhead
import data_throughput
import dvc_noop
import family_step
import latent_cache
import orchestration
import reward_server_load
import scaling
import torch

from flowpost.core.io import read_json, write_json_atomic

BENCH = Path(__file__).resolve().parent
STUDIES = "# Studies run on their own"  # results.md from this heading on is not rewritten by a run
SMALL_BATCHES = [  # the quick profile's: the default pipeline's model on an eighth of its batches
    "stages.sft.train.batch_size=8",
    "stages.grpo.train.prompts_per_iteration=2",
    "stages.grpo.train.group_size=4",
    "stages.grpo.train.rollout_batch_size=8",
    "stages.grpo.train.train_batch_size=4",
]
SMALL = [flag for value in SMALL_BATCHES for flag in ("--set", value)]
PROFILES: dict[str, dict[str, list[str]]] = {
    "full": {
        "core_overhead": ["--sft-steps", "12", "--grpo-iterations", "3", "--rounds", "4"],
        "family_step": ["--steps", "12", "--rounds", "4"],
        "condition_cache": ["--steps", "12", "--rounds", "4"],
        "data_throughput": ["--batches", "40", "--steps", "12", "--rounds", "4", "--items", "200"],
        "latent_cache": ["--steps", "12", "--rounds", "4"],
        "orchestration": ["--smoke", "--repeats", "2"],
        "dvc_noop": ["--repeats", "2"],
        "scaling": ["--processes", "1", "2", "--steps", "20"],
        "reward_server_load": ["--clients", "16", "--requests", "25"],
    },
    "quick": {
        "core_overhead": ["--sft-steps", "4", "--grpo-iterations", "3", "--rounds", "2", *SMALL],
        "family_step": ["--steps", "12", "--rounds", "2", "--batch-size", "4", "--records", "16"],
        "condition_cache": ["--steps", "4", "--rounds", "2", *SMALL],
        "data_throughput": ["--batches", "10", "--steps", "4", "--rounds", "2", "--items", "50", *SMALL],
        "latent_cache": ["--steps", "8", "--rounds", "3", "--batch-size", "8"],
        "orchestration": ["--smoke", "--repeats", "1", *SMALL],
        "dvc_noop": ["--repeats", "1", *SMALL],
        "scaling": ["--processes", "1", "2", "--steps", "10", *SMALL],
        "reward_server_load": ["--clients", "8", "--requests", "5"],
    },
}
MODULES = {
    "core_overhead": core_overhead,
    "family_step": family_step,
    "condition_cache": condition_cache,
    "data_throughput": data_throughput,
    "latent_cache": latent_cache,
    "orchestration": orchestration,
    "dvc_noop": dvc_noop,
    "scaling": scaling,
    "reward_server_load": reward_server_load,
}


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms" if seconds >= 1e-3 else f"{1e6 * seconds:.1f} µs"


def core_section(result: dict[str, Any]) -> list[str]:
    rows = ["| stage | unit | flowpost (median) | hand-written loop (median) | ratio (goal ≤ 1.05) | units timed |"]
    rows.append("| --- | --- | --- | --- | --- | --- |")
    for name, r in result.items():
        rows.append(
            f"| {name} | {r['unit']} | {_ms(r['flowpost_median_s'])} | {_ms(r['hand_median_s'])} "
            f"| {r['ratio']:.3f} | {r['units']} per arm |"
        )
    return rows


def family_section(result: dict[str, Any]) -> list[str]:
    rows = [
        "| family | flowpost (median) | bare diffusers loop (median) | added per step | ratio (goal ≤ 1.05) "
        "| CPU ratio | first-step loss (flowpost / bare) | steps timed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for family, r in result.items():
        losses = r["first_loss"]
        rows.append(
            f"| {family} | {_ms(r['flowpost_median_s'])} | {_ms(r['bare_median_s'])} "
            f"| {_ms(r['flowpost_median_s'] - r['bare_median_s'])} | {r['ratio']:.3f} | {r['cpu_ratio']:.3f} "
            f"| {losses['flowpost']:.6f} / {losses['bare']:.6f} | {r['units']} per arm |"
        )
    first = next(iter(result.values()), {})
    rows += [
        "",
        f"SFT step, full fine-tuning with AdamW, batch {first.get('batch_size')}, VAE encode every step, "
        f"{first.get('threads')} torch thread(s); both arms' first-step losses agree within 1e-5 "
        "(checked before timing).",
        "",
        f"What flowpost adds ({added_ms(result)} per step here) is a fixed cost per step, not per FLOP: each "
        "sample's noise drawn from its own addressed generator, the non-finite loss and gradient check, the "
        "step's event and the batch read from the shards (the bare loop holds its batches in memory). On "
        "these toy steps of a few milliseconds that is the ratio above 1; on a real family's step (a second or "
        "more on a GPU) the same milliseconds are a fraction of a percent.",
    ]
    return rows


def added_ms(result: dict[str, Any]) -> str:
    """The range over families of flowpost's median step minus the bare loop's, in milliseconds."""
    added = sorted({f"{(r['flowpost_median_s'] - r['bare_median_s']) * 1e3:.1f}" for r in result.values()}, key=float)
    return f"{'-'.join(dict.fromkeys([added[0], added[-1]]))} ms" if added else "nothing"


def cache_section(result: dict[str, Any], batch: int) -> list[str]:
    return [
        "| conditions | median s/step | items/s |",
        "| --- | --- | --- |",
        f"| cached (parquet) | {_ms(result['cached_median_s'])} | {batch / result['cached_median_s']:.1f} |",
        f"| encoded every step (MiniLM) | {_ms(result['encoded_median_s'])} | "
        f"{batch / result['encoded_median_s']:.1f} |",
        "",
        f"Encoding every step is {1 / result['ratio']:.2f}× the cached step time ({result['units']} steps per arm).",
    ]


def data_section(result: dict[str, Any]) -> list[str]:
    batch = result["batch_size"]
    loader, training = result["loader_median_s"], result["training_median_s"]
    return [
        "| | median s/batch | items/s |",
        "| --- | --- | --- |",
        f"| loader (collated batches) | {_ms(loader)} | {batch / loader:.0f} |",
        f"| SFT training consumes | {_ms(training)} | {batch / training:.0f} |",
        "",
        f"The loader needs {100 * result['ratio']:.2f} % of a training step's time per batch "
        f"(headroom {1 / result['ratio']:.0f}×).",
        *acquisition_rows(result.get("acquisition") or {}),
    ]


def acquisition_rows(result: dict[str, Any]) -> list[str]:
    """Acquisition throughput per source (absent from results measured before it was)."""
    if not result:
        return []
    rows = [
        "",
        "| acquisition (64x64 PNG, decode to shards) | items | median s | items/s |",
        "| --- | --- | --- | --- |",
    ]
    for source, r in result.items():
        rows.append(f"| {source} | {r['items']} | {r['median_s']:.2f} | {r['items_per_s']:.0f} |")
    return rows


def latent_section(result: dict[str, Any]) -> list[str]:
    batch = result["batch_size"]
    cached, encoded = result["cached_median_s"], result["encoded_median_s"]
    return [
        f"{result['family']} family, {result['image_size']}×{result['image_size']} RGB images, VAE "
        f"{result['vae']}; the cache itself took {result['cache_seconds']:.1f} s for {result['items']} items "
        f"({result['items'] / result['cache_seconds']:.0f} items/s).",
        "",
        "| output latents | median s/step | items/s | median CPU s/step |",
        "| --- | --- | --- | --- |",
        f"| cached (latents.<name>) | {_ms(cached)} | {batch / cached:.1f} | {_ms(result['cpu_cached_median_s'])} |",
        f"| VAE encode every step | {_ms(encoded)} | {batch / encoded:.1f} | {_ms(result['cpu_encoded_median_s'])} |",
        "",
        f"Encoding every step is {1 / result['ratio']:.2f}× the cached step time, "
        f"{1 / result['cpu_ratio']:.2f}× its CPU time ({result['units']} steps per arm).",
    ]


def orchestration_section(result: dict[str, Any]) -> list[str]:
    runs = result["runs"]
    walls = {mode: sum(r["wall"] for r in rs) / len(rs) for mode, rs in runs.items()}
    rows = [
        f"Whole run: flow {walls['flow']:.1f} s, direct {walls['direct']:.1f} s (means of {len(runs['flow'])}); "
        f"fixed overhead of a flow run {result['fixed']:.1f} s (goal ≤ 20 s).",
        "",
        "| node | direct s | flow s | flow overhead |",
        "| --- | --- | --- | --- |",
    ]
    for node, overhead in result["per_node"].items():
        direct = sum(r["nodes"][node] for r in runs["direct"]) / len(runs["direct"])
        flow = sum(r["nodes"].get(node, float("nan")) for r in runs["flow"]) / len(runs["flow"])
        rows.append(f"| {node} | {direct:.1f} | {flow:.1f} | {100 * overhead:+.1f} % |")
    if result["training_cpu_share"]:
        rows += ["", "CPU the run's other processes take while a training stage runs, added by the flow:", ""]
        rows += [
            f"- {node}: {100 * share:+.2f} % of the stage's CPU" for node, share in result["training_cpu_share"].items()
        ]
    return rows


def dvc_section(result: dict[str, Any]) -> list[str]:
    return [
        "| no-op (nothing changed) | median s |",
        "| --- | --- |",
        f"| `dvc repro` | {result['dvc_repro_median_s']:.1f} |",
        f"| `flowpost run --smoke` (every node cached) | {result['flowpost_run_median_s']:.1f} |",
    ]


def scaling_section(result: dict[str, Any]) -> list[str]:
    rows = [
        "| stage | processes | backend | samples/s | speedup | grad sync s/step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, measured in result.items():
        base = measured[0]["samples_per_second"]
        for r in measured:
            rows.append(
                f"| {name} | {r['processes']} | {r['backend']} | {r['samples_per_second']:.1f} "
                f"| {r['samples_per_second'] / base:.2f} | {r['grad_sync_seconds']:.4f} |"
            )
    return rows


def load_section(result: dict[str, Any]) -> list[str]:
    return [
        "| clients | requests | ok | failed | wrong answers | answered twice | lost | p50 | p99 | requests/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {result['clients']} | {result['requests']} | {result['ok']} | {result['failed']} "
        f"| {result['wrong_answers']} | {result['answered_twice']} | {result['lost']} | {result['p50_ms']} ms "
        f"| {result['p99_ms']} ms | {result['requests_per_s']} |",
    ]


def render(name: str, workspace: Path) -> list[str]:
    """The markdown lines of benchmark ``name`` from the JSON it wrote."""
    result = read_json(workspace / f"{name}.json")
    if name == "core_overhead":
        return core_section(result)
    if name == "family_step":
        return family_section(result)
    if name == "condition_cache":
        return cache_section(result, result["batch_size"])
    if name == "data_throughput":
        return data_section(result)
    if name == "latent_cache":
        return latent_section(result)
    if name == "orchestration":
        return orchestration_section(result)
    if name == "dvc_noop":
        return dvc_section(result)
    if name == "reward_server_load":
        return load_section(result)
    return scaling_section(result)


TITLES = {
    "core_overhead": "Core overhead: flowpost's trainer against a hand-written torch loop",
    "family_step": "Family step: each pipeline family's SFT step through flowpost against a bare diffusers loop",
    "condition_cache": "Condition cache: cached embeddings against encoding prompts every step",
    "data_throughput": "Data: loader throughput against what training consumes; acquisition throughput",
    "latent_cache": "Latent cache: cached VAE latents against encoding the images every step",
    "orchestration": "Orchestration: the Prefect flow against the same nodes run directly",
    "dvc_noop": "A no-op `dvc repro`",
    "scaling": "Scaling: 1 → 2 processes on CPU",
    "reward_server_load": "Reward server under load: concurrent clients on loopback",
}


def _machine() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH, capture_output=True, text=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit.stdout.strip() or 'unknown'}, "
        f"{os.cpu_count()} CPU cores, load average {load} at the end, Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def _studies(out: Path) -> list[str]:
    """The part of ``out`` from the ``STUDIES`` heading on (studies run and written up on their own), kept by
    every run."""
    text = out.read_text() if out.is_file() else ""
    start = text.find(STUDIES)
    return [] if start < 0 else [text[start:].rstrip("\n"), ""]


def write_results(out: Path, profile: str, sections: list[str], seconds: float, machine: str) -> None:
    """``out``: when, where and how the figures were measured, how to rerun them, then ``sections``, then the
    studies it held."""
    rerun = "python bench/run_all.py" + (" --quick" if profile == "quick" else "")
    header = [
        "# Benchmarks",
        "",
        f"Profile `{profile}`{f', {seconds:.0f} s in all' if seconds else ''}; {machine}.",
        "",
        "Each benchmark measures flowpost and its baseline in the same run, alternating their order round by",
        "round, and reports medians and the ratio. The figures below come from a shared, noisy machine",
        "(see the load average); rerun them on an otherwise idle one before quoting them.",
        "",
        "How to rerun (from the repository root, with flowpost installed):",
        "",
        "```",
        f"{rerun}            # everything; writes bench/results.md",
        "make bench                          # the full profile, the same as python bench/run_all.py",
        "python bench/run_all.py --only core_overhead   # one benchmark (or several)",
        "```",
        "",
        "Each section names the command that reruns that benchmark alone (its JSON lands in the workspace).",
        "",
    ]
    out.write_text("\n".join(header + sections + _studies(out)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small budgets: check that every benchmark runs")
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--out", type=Path, default=BENCH / "results.md")
    parser.add_argument("--only", nargs="+", choices=list(MODULES), help="run these benchmarks only")
    parser.add_argument(
        "--render", action="store_true", help="run nothing: write the results of earlier runs in the workspace"
    )
    args = parser.parse_args(argv)
    profile = "quick" if args.quick else "full"
    timings = args.workspace / "run_all.json"  # each benchmark's seconds and where the run measured them
    recorded = read_json(timings) if args.render and timings.is_file() else {}
    seconds: dict[str, float] = recorded.get("seconds", {})
    machine = recorded.get("machine", "measured where and when not recorded")
    sections: list[str] = []
    for name, module in MODULES.items():
        if args.only and name not in args.only:
            continue
        flags = PROFILES[profile][name]
        command = f"python bench/{name}.py --workspace {args.workspace} {' '.join(flags)}"
        if args.render:
            body = _rendered(name, args.workspace)
        else:
            print(f"\n== {name}: {command}", flush=True)
            begun = time.monotonic()
            body = _run(module.main, ["--workspace", str(args.workspace), *flags], name, args.workspace)
            seconds[name] = time.monotonic() - begun
            machine = _machine()
            write_json_atomic(timings, {"seconds": seconds, "machine": machine})
        took = f" ({seconds[name]:.0f} s)" if name in seconds else ""
        sections += [f"## {TITLES[name]}", "", f"`{command}`{took}", "", *body, ""]
        write_results(args.out, profile, sections, sum(seconds.values()), machine)  # a later failure keeps these
    print(f"\nwrote {args.out}")
    return 0


def _rendered(name: str, workspace: Path) -> list[str]:
    if not (workspace / f"{name}.json").is_file():
        return ["Not measured yet; the command above runs it."]
    return render(name, workspace)


def _run(entry: Callable[[list[str]], int], argv: list[str], name: str, workspace: Path) -> list[str]:
    """Run one benchmark and render its results, or say how it failed."""
    try:
        entry(argv)
        return render(name, workspace)
    except Exception as exc:  # noqa: BLE001 - one failing benchmark must not hide the others' results
        traceback.print_exc()
        return [f"**Failed**: `{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}`"]


if __name__ == "__main__":
    sys.exit(main())
