"""The pipeline as DVC stages: generated files, and real `dvc repro` / `exp run` / push / pull."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_main import flowpost_main

from flowpost.core.config.loading import load_pipeline, validate_pipeline
from flowpost.tasks.dvc import CODE_DIR, dvc_stages, out_of_sync, render, write_code_files
from flowpost.tasks.graph import build_nodes, code_fingerprint, code_scope

REPO = Path(__file__).resolve().parents[2]


def test_committed_dvc_files_match_the_default_pipeline() -> None:
    assert out_of_sync(load_pipeline(None), REPO) == []


def test_each_node_is_a_stage_with_its_params_and_durable_outs(tiny_pipeline) -> None:
    stages = dvc_stages(validate_pipeline(tiny_pipeline()))["stages"]
    assert list(stages) == ["code", "acquire.digits", "conditions.minilm", "train.sft", "eval.sft", "export", "report"]
    train = stages["train.sft"]
    assert train["cmd"].startswith(
        "flowpost run-node train.sft --pipeline params.yaml --workspace workspace --folders fixed"
    )
    assert train["deps"] == ["workspace/code/train.sft.json", "workspace/data/digits", "workspace/conditions/minilm"]
    assert "stages.sft.train" in train["params"] and "stages.sft.callbacks.ema" in train["params"]
    assert not any("trackers" in key or "hang_timeout" in key for key in train["params"])
    assert train["outs"] == [
        "workspace/stages/sft/final",
        {"workspace/stages/sft/checkpoints": {"persist": True, "cache": False}},
    ]
    assert "evaluate.after" not in stages["eval.sft"]["params"]
    assert stages["export"]["deps"] == [
        "workspace/code/export.json",
        "workspace/stages/sft/final",
        "workspace/eval/sft",
    ]
    assert stages["report"]["metrics"] == [{"workspace/metrics.json": {"cache": False}}]


def test_every_node_depends_on_its_code_file_which_the_code_stage_writes_as_the_runner_fingerprints_it(
    tiny_pipeline, tmp_path: Path
) -> None:
    pipeline = validate_pipeline(tiny_pipeline())
    stages = dvc_stages(pipeline)["stages"]
    files = [f"{CODE_DIR}/{node}.json" for node in stages if node != "code"]
    assert stages["code"] == {
        "cmd": f"flowpost dvc code {CODE_DIR} --pipeline params.yaml",
        "always_changed": True,
        "outs": files,
    }
    assert [stage["deps"][0] for name, stage in stages.items() if name != "code"] == files
    deps = [dep for stage in stages.values() for dep in stage.get("deps", [])]
    assert all(dep.startswith("workspace/") for dep in deps)  # none depends on where flowpost is installed
    written = write_code_files(pipeline, tmp_path)
    for node in build_nodes(pipeline):
        content = {"code": code_fingerprint(node), "modules": code_scope(node)}
        assert json.loads((tmp_path / f"{node.id}.json").read_text()) == content
        assert written[node.id] == content["code"]


def test_params_file_is_the_resolved_pipeline(tiny_pipeline) -> None:
    pipeline = validate_pipeline(tiny_pipeline())
    params = yaml.safe_load(render(pipeline)["params.yaml"])
    assert validate_pipeline(params) == pipeline


def _sh(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
    }
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.mark.slow
def test_dvc_repro_twice_exp_run_and_push_pull(tmp_path: Path, tiny_pipeline) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    dvc = [sys.executable, "-m", "dvc"]
    _sh(["git", "init", "-q"], repo)
    _sh(["git", "config", "user.email", "ci@example.com"], repo)
    _sh(["git", "config", "user.name", "ci"], repo)
    _sh([*dvc, "init", "-q"], repo)
    _sh([*dvc, "config", "core.analytics", "false"], repo)
    (repo / "pipeline.yaml").write_text(yaml.safe_dump({**tiny_pipeline(), "smoke": False}, sort_keys=False))
    _sh([sys.executable, "-m", "flowpost.cli", "dvc", "sync", "pipeline.yaml"], repo)

    first = _sh([*dvc, "repro"], repo)
    for node in ("acquire.digits", "train.sft", "report"):
        assert f"Running stage '{node}'" in first.stdout
    assert (repo / "workspace" / "metrics.json").is_file()
    assert (repo / "workspace" / "stages" / "sft" / "checkpoints" / "latest").is_file()
    again = _sh([*dvc, "repro"], repo)  # the code stage always runs; the same fingerprint reruns nothing
    ran = {line.split("'")[1] for line in again.stdout.splitlines() if line.startswith("Running stage")}
    assert ran == {"code"} and "Stage 'report' didn't change, skipping" in again.stdout
    _sh(["git", "add", "-A"], repo)
    _sh(["git", "commit", "-qm", "pipeline"], repo)

    changed = _sh([*dvc, "exp", "run", "-S", "stages.sft.train.lr=0.0005"], repo)
    ran = {line.split("'")[1] for line in changed.stdout.splitlines() if line.startswith("Running stage")}
    assert ran == {"code", "train.sft", "eval.sft", "export", "report"}
    assert yaml.safe_load((repo / "params.yaml").read_text())["stages"]["sft"]["train"]["lr"] == 0.0005
    metrics = repo / "workspace" / "metrics.json"
    assert json.loads(metrics.read_text())["sft"]["smoke"] is False

    smoke = _sh([*dvc, "exp", "run", "-S", "smoke=true"], repo)  # the wiring check: every node reruns
    ran = {line.split("'")[1] for line in smoke.stdout.splitlines() if line.startswith("Running stage")}
    assert {"acquire.digits", "conditions.minilm", "train.sft", "report"} <= ran
    assert json.loads(metrics.read_text())["sft"]["smoke"] is True

    export = repo / "workspace" / "stages" / "sft" / "export"
    before = _digests(export)
    remote = tmp_path / "remote"
    _sh([*dvc, "remote", "add", "-d", "local", str(remote)], repo)
    _sh([*dvc, "push"], repo)
    _sh(["rm", "-rf", "workspace", ".dvc/cache"], repo)
    _sh([*dvc, "pull"], repo)
    assert _digests(export) == before and before


def test_a_stale_dvc_file_is_named_with_its_folder(tmp_path: Path) -> None:
    from flowpost.errors import FlowpostError
    from flowpost.tasks.dvc import check_in_sync, sync

    pipeline = load_pipeline(None)
    sync(pipeline, tmp_path)
    check_in_sync(pipeline, tmp_path)
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    with pytest.raises(FlowpostError, match=rf"{tmp_path}: dvc.yaml out of sync with the pipeline"):
        check_in_sync(pipeline, tmp_path)


def test_a_dvc_file_calling_flowpost_stage_is_out_of_sync_and_sync_rewrites_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dvc.yaml as flowpost wrote it before `flowpost stage` became `flowpost run-node` (and `--layout`,
    `--folders`): `--check` names it, and `dvc sync` rewrites it alone."""
    monkeypatch.chdir(tmp_path)
    assert flowpost_main("dvc", "sync").code == 0
    current = Path("dvc.yaml").read_text()
    older = current.replace("flowpost run-node ", "flowpost stage ").replace("--folders fixed", "--layout fixed")
    assert older != current
    Path("dvc.yaml").write_text(older)
    checked = flowpost_main("dvc", "sync", "--check")
    assert (checked.code, checked.stderr) == (
        1,
        "error: .: dvc.yaml out of sync with the pipeline; run `flowpost dvc sync`\n",
    )
    assert flowpost_main("dvc", "sync").stdout == "wrote dvc.yaml\n"
    assert Path("dvc.yaml").read_text() == current and flowpost_main("dvc", "sync", "--check").code == 0
