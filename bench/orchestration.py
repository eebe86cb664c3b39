"""What Prefect costs: a pipeline run as a flow against the same nodes run directly.

    python bench/orchestration.py [--workspace bench-ws] [--sft-steps N] [--grpo-iterations N] [--repeats 1] [--smoke]
                                   [--set KEY=VALUE ...]

Runs the default pipeline (its own budgets unless cut as given, or the smoke profile's with
``--smoke``; 100 eval samples) in fresh
workspaces, each in its own process, ``--repeats`` times, the order alternating from pair to pair
(direct then flow, flow then direct: the machine's speed drifts): once node by node
through the runner without Prefect, once with ``flowpost run`` (a temporary Prefect server, one
task per node, logs and artifacts). Reports the fixed overhead of a flow run (wall time outside
the nodes, minus the same for the direct run: server start, flow and task bookkeeping) and each
node's overhead (its seconds in the flow against its seconds run directly), as means over pairs.
Because this machine's speed drifts by more than 2 % within minutes, it also samples every process
of each run from ``/proc`` and reports, per training stage, the CPU the run's other processes
(runner, Prefect server) used while the stage ran, per CPU second of the stage: the share of the
machine the orchestration competes for, which wall-clock pairs cannot resolve. Goals: fixed
<= 20 s, <= 2 % per training stage. Writes ``WORKSPACE/orchestration.json``. Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cpu_share import TreeSampler

from flowpost.core.io import read_json, write_json_atomic

DIRECT = """
import sys
from flowpost.core.config.loading import load_pipeline
from flowpost.tasks.runner import PipelineRun
run = PipelineRun(load_pipeline(None, sys.argv[2:]), sys.argv[1])
for node in run.nodes:
    run.execute(node)
run.publish_report()
"""


def overrides(sft_steps: int | None, grpo_iterations: int | None, *, smoke: bool = False) -> list[str]:
    cuts = {"stages.sft.train.max_steps": sft_steps, "stages.grpo.train.iterations": grpo_iterations}
    sets = [f"{key}={value}" for key, value in cuts.items() if value is not None] + ["evaluate.samples=100"]
    return [*sets, "smoke=true"] if smoke else sets


def timed(command: list[str], log: Path) -> tuple[float, TreeSampler]:
    """Wall seconds of ``command`` (its output to ``log``) and its process tree's CPU; raises if it fails."""
    started = time.monotonic()
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
        sampler = TreeSampler(process.pid).start()
        returncode = process.wait()
        sampler.stop()
    if returncode:
        raise subprocess.CalledProcessError(returncode, command)
    return time.monotonic() - started, sampler


def training_cpu(sampler: TreeSampler, workspace: Path, nodes: list[str]) -> dict[str, dict[str, float]]:
    """Per training node: CPU seconds of its stage process, and of every other process of the run
    (runner, Prefect server, ...) while the stage process lived."""
    found = {}
    for node in nodes:
        seen = sampler.lifetime(f"flowpost.stage {workspace}/{node}/")
        if seen is not None:
            pid, start, end = seen
            stage = sampler.cpu_between(start, end, only={pid})
            found[node] = {"stage": stage, "others": sampler.cpu_between(start, end) - stage}
    return found


def node_seconds(workspace: Path) -> dict[str, float]:
    """Seconds each node took, from the completion manifests of a content-addressed workspace."""
    seconds = {}
    for manifest in workspace.glob("*/*/_complete.json"):
        record = read_json(manifest)
        seconds[record["node"]] = float(record["seconds"])
    return seconds


def run_once(root: Path, mode: str, sets: list[str], repeat: int) -> dict[str, Any]:
    """One run in a fresh workspace: wall seconds, per-node seconds, seconds outside the nodes."""
    workspace = root / f"{mode}-{repeat}"
    shutil.rmtree(workspace, ignore_errors=True)
    workspace.mkdir(parents=True)
    if mode == "direct":
        command = [sys.executable, "-c", DIRECT, str(workspace), *sets]
    else:
        flags = [flag for value in sets for flag in ("--set", value)]
        command = [sys.executable, "-m", "flowpost.cli", "run", "--workspace", str(workspace), *flags]
    wall, sampler = timed(command, root / f"{mode}-{repeat}.log")
    nodes = node_seconds(workspace)
    cpu = training_cpu(sampler, workspace.resolve(), [node for node in nodes if node.startswith("train.")])
    return {"wall": wall, "nodes": nodes, "outside_nodes": wall - sum(nodes.values()), "training_cpu": cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--sft-steps", type=int, help="default: the pipeline's")
    parser.add_argument("--grpo-iterations", type=int, help="default: the pipeline's")
    parser.add_argument("--repeats", type=int, default=1, help="direct/flow pairs, interleaved (machine drift)")
    parser.add_argument("--smoke", action="store_true", help="the smoke profile: a few steps per stage")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="pipeline override (dotted)")
    args = parser.parse_args(argv)
    root = args.workspace / "orchestration"
    sets = overrides(args.sft_steps, args.grpo_iterations, smoke=args.smoke) + args.overrides
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "flow": []}
    for repeat in range(args.repeats):
        for mode in ("direct", "flow") if repeat % 2 == 0 else ("flow", "direct"):
            runs[mode].append(run_once(root, mode, sets, repeat))
    fixed = statistics.mean(
        f["outside_nodes"] - d["outside_nodes"] for d, f in zip(runs["direct"], runs["flow"], strict=True)
    )
    walls = {mode: statistics.mean(r["wall"] for r in rs) for mode, rs in runs.items()}
    print(f"{args.repeats} interleaved pair(s): flow run {walls['flow']:.1f} s, direct {walls['direct']:.1f} s (means)")
    print(f"fixed overhead of a flow run: {fixed:.1f} s (goal <= 20 s)\n")
    print("node                 direct s   flow s   overhead (mean of pairs)")
    per_node = {}
    for node in runs["direct"][0]["nodes"]:
        pairs = [
            (d["nodes"][node], f["nodes"].get(node, float("nan")))
            for d, f in zip(runs["direct"], runs["flow"], strict=True)
        ]
        per_node[node] = statistics.mean((f - d) / d if d > 0 else float("nan") for d, f in pairs)
        direct, flow = statistics.mean(d for d, _ in pairs), statistics.mean(f for _, f in pairs)
        print(f"{node:<20} {direct:>8.1f} {flow:>8.1f} {100 * per_node[node]:>9.1f} %")
    print("\nCPU the run's other processes used while a training stage ran, per 100 CPU s of the stage")
    print("node                 direct   flow   flow adds (mean of pairs)")
    cpu_share = {}
    for node in runs["direct"][0]["training_cpu"]:
        shares = {
            mode: [r["training_cpu"][node]["others"] / r["training_cpu"][node]["stage"] for r in rs]
            for mode, rs in runs.items()
        }
        cpu_share[node] = statistics.mean(f - d for d, f in zip(shares["direct"], shares["flow"], strict=True))
        direct, flow = (100 * statistics.mean(shares[mode]) for mode in ("direct", "flow"))
        print(f"{node:<20} {direct:>6.2f} {flow:>6.2f} {100 * cpu_share[node]:>8.2f} %")
    summary = {"runs": runs, "fixed": fixed, "per_node": per_node, "training_cpu_share": cpu_share}
    write_json_atomic(args.workspace / "orchestration.json", summary)
    print(f"\nwrote {args.workspace / 'orchestration.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
