"""With flowpost installed as a package (a copy outside the repository, not an editable checkout),
`flowpost dvc sync --check` answers as from the checkout, and `dvc repro` reruns what a new flowpost
version changes: each node's code fingerprint reaches DVC through the ``code`` stage, so an edit outside a
node's code scope reruns nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _installed_copy(site: Path) -> Path:
    shutil.copytree(REPO / "flowpost", site / "flowpost", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _sh(args: list[str], cwd: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``args`` with ``site`` as the only flowpost on the path (``-P``: not the working directory's)."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(site),
        "PYTHONSAFEPATH": "1",
        "DVC_NO_ANALYTICS": "1",
    }
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{' '.join(done.args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _ran(stdout: str) -> set[str]:
    return {line.split("'")[1] for line in stdout.splitlines() if line.startswith("Running stage")}


@pytest.mark.slow  # about 10 s: two CLI processes
def test_sync_check_gives_the_same_answer_installed_or_from_the_checkout(tmp_path: Path) -> None:
    site = _installed_copy(tmp_path / "site")
    where = _ok(_sh([sys.executable, "-c", "import flowpost; print(flowpost.__file__)"], REPO, site))
    assert where.strip() == str(site / "flowpost" / "__init__.py")
    check = [sys.executable, "-m", "flowpost.cli", "dvc", "sync", "--check"]
    assert "in sync" in _ok(_sh(check, REPO, site))
    assert "in sync" in _ok(_sh(check, REPO, REPO))


@pytest.mark.slow  # about 70 s: dvc repro of one acquisition, five times
def test_dvc_repro_reruns_what_a_new_installed_version_or_a_changed_image_changes(
    tmp_path: Path, tiny_pipeline
) -> None:
    site = _installed_copy(tmp_path / "site")
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "tests" / "data" / "folder", repo / "images")
    dvc = [sys.executable, "-m", "dvc"]
    for args in (["git", "init", "-q"], [*dvc, "init", "-q"], [*dvc, "config", "core.analytics", "false"]):
        _ok(_sh(args, repo, site))
    config = tiny_pipeline()
    config["datasets"] = {"shapes": {"source": "image-folder", "path": "images", "preprocess": {"mode": "grayscale"}}}
    config["conditions"]["minilm"]["datasets"] = ["shapes"]
    config["stages"]["sft"]["data"]["dataset"] = "shapes"
    del config["evaluate"]
    (repo / "pipeline.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    _ok(_sh([sys.executable, "-m", "flowpost.cli", "dvc", "sync", "pipeline.yaml"], repo, site))

    repro = [*dvc, "repro", "acquire.shapes"]
    assert _ran(_ok(_sh(repro, repo, site))) == {"code", "acquire.shapes"}
    assert _ran(_ok(_sh(repro, repo, site))) == {"code"}
    with (site / "flowpost" / "data" / "shards.py").open("a") as handle:
        handle.write("# the next release\n")
    assert _ran(_ok(_sh(repro, repo, site))) == {"code", "acquire.shapes"}
    with (site / "flowpost" / "core" / "trainers" / "offline" / "sft.py").open("a") as handle:
        handle.write("# a trainer fix\n")  # in train.sft's scope, not the acquisition's
    assert _ran(_ok(_sh(repro, repo, site))) == {"code"}
    image = repo / "images" / "bars" / "top-left-grey.png"
    image.write_bytes((repo / "images" / "bars" / "top-left-white.png").read_bytes())
    assert _ran(_ok(_sh(repro, repo, site))) == {"code", "acquire.shapes"}
