"""What Prefect costs: a pipeline run as a flow against the same nodes run directly.

    python bench/orchestration.py [--workspace bench-ws] [--sft-steps 100] [--grpo-iterations 5]

Runs the default pipeline (budgets cut as given, 100 eval samples) twice in fresh workspaces, each
in its own process: once with ``flowpost run`` (a temporary Prefect server, one task per node, logs
and artifacts) and once node by node through the same runner without Prefect. Reports the fixed
overhead of a flow run (wall time outside the nodes, minus the same for the direct run: server
start, flow and task bookkeeping) and each node's overhead (its seconds in the flow against its
seconds run directly). Goals: fixed <= 20 s, <= 2 % per training stage. Writes
``WORKSPACE/orchestration.json``. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

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


def overrides(sft_steps: int, grpo_iterations: int) -> list[str]:
    return [
        f"stages.sft.train.max_steps={sft_steps}",
        f"stages.grpo.train.iterations={grpo_iterations}",
        "evaluate.samples=100",
    ]


def timed(command: list[str], log: Path) -> float:
    """Wall seconds of ``command`` (its output to ``log``); raises if it fails."""
    started = time.monotonic()
    with log.open("w") as handle:
        subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, check=True)
    return time.monotonic() - started


def node_seconds(workspace: Path) -> dict[str, float]:
    """Seconds each node took, from the completion manifests of a content-addressed workspace."""
    seconds = {}
    for manifest in workspace.glob("*/*/_complete.json"):
        record = read_json(manifest)
        seconds[record["node"]] = float(record["seconds"])
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--sft-steps", type=int, default=100)
    parser.add_argument("--grpo-iterations", type=int, default=5)
    args = parser.parse_args(argv)
    root = args.workspace / "orchestration"
    sets = overrides(args.sft_steps, args.grpo_iterations)
    runs = {}
    for mode in ("direct", "flow"):
        workspace = root / mode
        shutil.rmtree(workspace, ignore_errors=True)
        workspace.mkdir(parents=True)
        if mode == "direct":
            command = [sys.executable, "-c", DIRECT, str(workspace), *sets]
        else:
            flags = [flag for value in sets for flag in ("--set", value)]
            command = [sys.executable, "-m", "flowpost.cli", "run", "--workspace", str(workspace), *flags]
        wall = timed(command, root / f"{mode}.log")
        nodes = node_seconds(workspace)
        runs[mode] = {"wall": wall, "nodes": nodes, "outside_nodes": wall - sum(nodes.values())}
    fixed = runs["flow"]["outside_nodes"] - runs["direct"]["outside_nodes"]
    print(f"flow run {runs['flow']['wall']:.1f} s, direct {runs['direct']['wall']:.1f} s")
    print(f"fixed overhead of a flow run: {fixed:.1f} s (goal <= 20 s)\n")
    print("node                 direct s   flow s   overhead")
    per_node = {}
    for node, direct in runs["direct"]["nodes"].items():
        flow = runs["flow"]["nodes"].get(node, float("nan"))
        per_node[node] = (flow - direct) / direct if direct > 0 else float("nan")
        print(f"{node:<20} {direct:>8.1f} {flow:>8.1f} {100 * per_node[node]:>9.1f} %")
    write_json_atomic(args.workspace / "orchestration.json", {"runs": runs, "fixed": fixed, "per_node": per_node})
    print(f"\nwrote {args.workspace / 'orchestration.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
