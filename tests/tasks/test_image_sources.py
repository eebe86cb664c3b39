"""Image sources through the runner: cached on the same files, rerun on one changed file; the
folder-sft example trains and exports on the image folder that ships with the tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flowpost.core.config.loading import load_pipeline, validate_pipeline
from flowpost.core.io import read_json
from flowpost.tasks.runner import SOURCE_FILES, PipelineRun

REPO = Path(__file__).parents[2]
FOLDER = REPO / "tests" / "data" / "folder"


def _pipeline(tiny_pipeline, folder: Path) -> dict:
    config = tiny_pipeline()
    config["datasets"] = {
        "shapes": {"source": "image-folder", "path": str(folder), "preprocess": {"mode": "grayscale"}}
    }
    config["conditions"]["minilm"]["datasets"] = ["shapes"]
    config["stages"]["sft"]["data"]["dataset"] = "shapes"
    del config["evaluate"]
    return config


def test_same_files_are_cached_and_one_changed_file_reruns_the_acquisition(tiny_pipeline, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    shutil.copytree(FOLDER, folder)
    pipeline = validate_pipeline(_pipeline(tiny_pipeline, folder))
    run = PipelineRun(pipeline, tmp_path / "ws")
    assert set(run.inputs["acquire.shapes"]["sources"]) == {SOURCE_FILES}
    assert run.execute("acquire.shapes").status == "ran"
    assert PipelineRun(pipeline, tmp_path / "ws").execute("acquire.shapes").status == "cached"

    (folder / "bars" / "top-left-grey.png").write_bytes((folder / "bars" / "top-left-white.png").read_bytes())
    changed = PipelineRun(pipeline, tmp_path / "ws")
    assert changed.fingerprints["acquire.shapes"] != run.fingerprints["acquire.shapes"]
    assert changed.execute("acquire.shapes").status == "ran"


def _example_run(tmp_path: Path, monkeypatch) -> PipelineRun:
    monkeypatch.chdir(REPO)  # the example's path is relative to the repository root
    pipeline = load_pipeline(REPO / "examples" / "folder-sft.yaml", ["smoke=true", "stages.sft.train.max_steps=2"])
    return PipelineRun(pipeline, tmp_path / "ws")


def test_the_folder_sft_example_acquires_and_encodes_the_shipped_folder(tmp_path: Path, monkeypatch) -> None:
    run = _example_run(tmp_path, monkeypatch)
    assert list(run.nodes) == ["acquire.shapes", "conditions.minilm", "train.sft", "eval.sft", "export", "report"]
    assert run.execute("acquire.shapes").status == "ran"
    manifest = read_json(run.path("acquire.shapes") / "manifest.json")
    assert manifest["counts"]["train"] + manifest["counts"]["eval"] == 24 and manifest["counts"]["bad"] == 0
    assert not {e["prompt"] for e in manifest["eval_prompts"]} & set(manifest["train_prompts"])
    assert run.execute("conditions.minilm").outputs["total"] == 25  # 24 captions and the null prompt


@pytest.mark.slow  # about 30 s: a training process and an export
def test_the_folder_sft_example_trains_and_exports_in_smoke_mode(tmp_path: Path, monkeypatch) -> None:
    run = _example_run(tmp_path, monkeypatch)
    results = {node: run.execute(node) for node in run.nodes}
    assert {result.status for result in results.values()} == {"ran"}
    assert results["export"].outputs["step"] == 2
