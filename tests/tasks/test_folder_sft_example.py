"""``examples/folder-sft.yaml`` end to end: trained on the shipped image folder, evaluated with two
metrics over two seeds, under ``flowpost run`` (Prefect) and under ``dvc repro``, with equal results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHORT = ["--smoke", "--set", "stages.sft.train.max_steps=2"]


def _sh(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PREFECT_HOME": str(cwd / "prefect-home"),
        "DVC_NO_ANALYTICS": "1",
    }
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.slow  # about a minute: two training processes, a Prefect server and DVC
def test_folder_sft_evaluates_two_metrics_over_two_seeds_under_flowpost_run_and_dvc_repro(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "tests" / "data" / "folder", repo / "tests" / "data" / "folder")
    shutil.copy(REPO / "examples" / "folder-sft.yaml", repo / "folder-sft.yaml")
    flowpost = [sys.executable, "-m", "flowpost.cli"]

    _sh([*flowpost, "run", "folder-sft.yaml", "--workspace", "ws", *SHORT], repo)
    run_metrics = json.loads((repo / "ws" / "metrics.json").read_text())["sft"]
    assert run_metrics["n_samples"] == 32  # 16 samples of the held-out caption for each of the two seeds
    for key in ("brightness", "jpeg_incompressibility"):
        low, high = run_metrics["intervals"][key]
        assert low <= run_metrics[key] <= high and low < high
    assert 0 < run_metrics["brightness"] < 1 and run_metrics["jpeg_incompressibility"] > 0
    report = (repo / "ws" / "report.md").read_text()
    assert "| stage | brightness | jpeg_incompressibility |" in report and "data:image/png;base64," in report

    _sh(["git", "init", "-q"], repo)
    _sh([sys.executable, "-m", "dvc", "init", "-q"], repo)
    _sh([*flowpost, "dvc", "sync", "folder-sft.yaml", "--set", "smoke=true", *SHORT[1:]], repo)
    repro = _sh([sys.executable, "-m", "dvc", "repro"], repo)
    assert "Running stage 'eval.sft'" in repro.stdout
    dvc_metrics = json.loads((repo / "workspace" / "metrics.json").read_text())["sft"]
    # the same nodes, bit for bit, whichever runner ran them; the cost ledger times each run, so it differs
    assert dvc_metrics.pop("cost").keys() == run_metrics.pop("cost").keys()
    assert dvc_metrics == run_metrics
