"""DVC stages depend on the local pretrained folders their nodes' fingerprints hash: ``model.pretrained``
of a stage or a cache, and its ``model.components`` folders; a hub id is pinned by the params."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pretrained_stage import with_model

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.dvc import dvc_stages
from flowpost.tasks.runner import PRETRAINED, PipelineRun

REPO = Path(__file__).resolve().parents[2]


def _sd3(tiny_pipeline, model: dict[str, Any], images: str = str(REPO / "tests" / "data" / "folder")) -> dict[str, Any]:
    """The tiny pipeline training ``model`` on colour images (its VAE reads three channels), unevaluated."""
    config = with_model(tiny_pipeline, model)
    config["datasets"] = {"shapes": {"source": "image-folder", "path": images, "preprocess": {"mode": "rgb"}}}
    del config["conditions"]["minilm"], config["evaluate"]
    config["conditions"]["own"]["datasets"] = ["shapes"]
    config["stages"]["sft"]["data"]["dataset"] = "shapes"
    return config


def test_a_local_pretrained_folder_and_its_components_are_dependencies_of_the_nodes_that_hash_them(
    tiny_pipeline, sd3_pipeline_dir: Path, tmp_path: Path
) -> None:
    transformer = tmp_path / "tuned"
    shutil.copytree(sd3_pipeline_dir / "transformer", transformer)
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "components": {"transformer": str(transformer)}}
    pipeline = validate_pipeline(_sd3(tiny_pipeline, model))
    stages = dvc_stages(pipeline)["stages"]
    assert stages["train.sft"]["deps"][-2:] == [str(sd3_pipeline_dir), str(transformer)]
    assert stages["conditions.own"]["deps"][-1] == str(sd3_pipeline_dir)
    inputs = PipelineRun(pipeline, tmp_path / "ws").inputs
    hashed = {node for node, value in inputs.items() if PRETRAINED in value.get("sources", {})}
    assert hashed == {"train.sft", "conditions.own"}  # what the plan hashes, DVC depends on
    depending = {name for name, stage in stages.items() if str(sd3_pipeline_dir) in stage.get("deps", [])}
    assert depending == hashed


def test_a_hub_id_is_no_dependency_but_a_param(tiny_pipeline, tmp_path: Path) -> None:
    config = _sd3(tiny_pipeline, {"family": "sd3", "pretrained": "someone/sd3-tiny", "revision": "abc"})
    pipeline = validate_pipeline(config)
    stages = dvc_stages(pipeline)["stages"]
    deps = [dep for stage in stages.values() for dep in stage.get("deps", [])]
    assert not [dep for dep in deps if not dep.startswith("workspace/") and "someone" in dep]
    assert (
        "stages.sft.model" in stages["train.sft"]["params"] and "conditions.own" in stages["conditions.own"]["params"]
    )
    assert PipelineRun(pipeline, tmp_path / "ws").inputs["train.sft"]["sources"][PRETRAINED]  # hub id and revision


def _sh(args: list[str], cwd: Path) -> str:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
    }
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _ran(stdout: str) -> set[str]:
    return {line.split("'")[1] for line in stdout.splitlines() if line.startswith("Running stage")}


@pytest.mark.slow  # about 30 s: dvc repro of an acquisition and a condition cache, three times
def test_dvc_repro_reruns_a_cache_when_its_local_pretrained_folder_changes(
    tiny_pipeline, sd3_pipeline_dir: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(sd3_pipeline_dir, repo / "weights")
    shutil.copytree(REPO / "tests" / "data" / "folder", repo / "images")
    dvc = [sys.executable, "-m", "dvc"]
    for args in (["git", "init", "-q"], [*dvc, "init", "-q"], [*dvc, "config", "core.analytics", "false"]):
        _sh(args, repo)
    config = _sd3(tiny_pipeline, {"family": "sd3", "pretrained": "weights"}, images="images")
    (repo / "pipeline.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    _sh([sys.executable, "-m", "flowpost.cli", "dvc", "sync", "pipeline.yaml"], repo)

    repro = [*dvc, "repro", "conditions.own"]
    assert _ran(_sh(repro, repo)) == {"code", "acquire.shapes", "conditions.own"}
    assert _ran(_sh(repro, repo)) == {"code"}
    scheduler = repo / "weights" / "scheduler" / "scheduler_config.json"
    scheduler.write_text(json.dumps({**json.loads(scheduler.read_text()), "shift": 2.0}))
    assert _ran(_sh(repro, repo)) == {"code", "conditions.own"}
