"""What "nothing changed" costs in each runner: a no-op ``dvc repro`` against a no-op ``flowpost run``
(every node cached) of the same smoke-profile default pipeline.

    python bench/dvc_noop.py [--workspace bench-ws] [--repeats 3] [--set KEY=VALUE ...]

Sets up (untimed) a git + DVC repository with ``flowpost dvc sync --set smoke=true`` and one
``dvc repro``, and one ``flowpost run --smoke`` into a workspace beside it; then times each no-op
``--repeats`` times, alternating. Writes ``WORKSPACE/dvc_noop.json``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from alternate import alternate

from flowpost.core.io import write_json_atomic


def _environment() -> dict[str, str]:
    """This interpreter's scripts (``flowpost``, ``dvc``) first on PATH, analytics off."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


def _run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, env=_environment(), capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed in {cwd}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def prepared_repository(root: Path, sets: list[str]) -> Path:
    """A repository whose smoke pipeline (``sets``: ``--set`` flags) ``dvc repro`` and ``flowpost run``
    have both completed."""
    repo = root / "dvc-noop"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    flowpost, dvc = [sys.executable, "-m", "flowpost.cli"], [sys.executable, "-m", "dvc"]
    for command in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "bench@example.com"],
        ["git", "config", "user.name", "bench"],
        [*dvc, "init", "-q"],
        [*dvc, "config", "core.analytics", "false"],
        [*flowpost, "dvc", "sync", "--set", "smoke=true", *sets],
        ["git", "add", "-A"],
        ["git", "commit", "-qm", "pipeline"],  # dvclive (the trackers) needs a commit to name its baseline
        [*dvc, "repro"],
        [*flowpost, "run", "--smoke", "--workspace", "flow-ws", *sets],
    ):
        _run(command, repo)
    return repo


def _dvc_noop(output: str) -> bool:
    """Nothing but the ``code`` stage ran: it is always changed by design, and an unchanged code record
    leaves every stage after it skipped."""
    ran = set(re.findall(r"Running stage '([^']+)'", output))
    return ran <= {"code"} and ("up to date" in output or "didn't change, skipping" in output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--repeats", type=int, default=3, help="timed no-ops per runner, alternating")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="pipeline override (dotted)")
    args = parser.parse_args(argv)
    sets = [flag for value in args.overrides for flag in ("--set", value)]
    repo = prepared_repository(args.workspace.resolve(), sets)

    def timed(command: list[str], expect: Callable[[str], bool]) -> list[float]:
        start = time.perf_counter()
        output = _run(command, repo)
        seconds = time.perf_counter() - start
        if not expect(output):
            raise RuntimeError(f"{' '.join(command)} was not a no-op:\n{output[-2000:]}")
        return [seconds]

    comparison = alternate(
        ("dvc_repro", lambda: timed([sys.executable, "-m", "dvc", "repro"], _dvc_noop)),
        (
            "flowpost_run",
            lambda: timed(
                [sys.executable, "-m", "flowpost.cli", "run", "--smoke", "--workspace", "flow-ws", *sets],
                lambda out: "cached" in out,
            ),
        ),
        rounds=args.repeats,
        unit="no-op run",
    )
    print(f"no-op: {comparison.line()}", flush=True)
    write_json_atomic(args.workspace / "dvc_noop.json", comparison.summary() | {"seconds": comparison.seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
