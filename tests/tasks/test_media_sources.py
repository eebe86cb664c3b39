"""The webdataset, hf-dataset and video-folder sources through the runner and DVC: the same files are
cached, one changed file reruns the acquisition, and DVC depends on what each source reads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from media_samples import save_hf_dataset, write_clip, write_shard
from PIL import Image

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.io import read_json
from flowpost.tasks.dvc import dvc_stages
from flowpost.tasks.runner import SOURCE_FILES, PipelineRun


def _png(value: int) -> bytes:
    import io

    buffer = io.BytesIO()
    Image.new("L", (12, 12), value).save(buffer, format="PNG")
    return buffer.getvalue()


def _shards(root: Path, value: int = 0) -> tuple[dict[str, Any], Path, list[str]]:
    for n in range(2):
        samples = [
            {"__key__": f"s{n}{i}", "png": _png(value + 10 * i), "txt": f"square {n} {i}".encode()} for i in range(6)
        ]
        write_shard(root / f"part-{n}.tar", samples)
    config = {"source": "webdataset", "shards": f"{root}/part-{{0..1}}.tar"}
    return config, root / "part-1.tar", [str(root / "part-0.tar"), str(root / "part-1.tar")]


def _saved(root: Path, value: int = 0) -> tuple[dict[str, Any], Path, list[str]]:
    save_hf_dataset(root, {"image": [_png(value + 10 * i) for i in range(8)], "text": [f"row {i}" for i in range(8)]})
    arrow = next(root.glob("*.arrow"))
    return {"source": "hf-dataset", "path": str(root)}, arrow, [str(root)]


def _clips(root: Path, value: int = 0) -> tuple[dict[str, Any], Path, list[str]]:
    for i in range(3):
        write_clip(root / f"{i}.mp4", frames=4 + value, fps=4)
        (root / f"{i}.txt").write_text(f"clip {i}")
    config = {"source": "video-folder", "path": str(root), "frames": {"count": 2, "fps": 4}}
    return config, root / "1.mp4", [str(root)]


SOURCES: dict[str, Callable[..., tuple[dict[str, Any], Path, list[str]]]] = {
    "webdataset": _shards,
    "hf-dataset": _saved,
    "video-folder": _clips,
}


def _pipeline(tiny_pipeline, dataset: dict[str, Any]) -> dict:
    config = tiny_pipeline()
    dataset["preprocess"] = {"mode": "grayscale", "resolution": 8}
    config["datasets"] = {"media": dataset}
    config["conditions"]["minilm"]["datasets"] = ["media"]
    config["stages"]["sft"]["data"]["dataset"] = "media"
    del config["evaluate"]
    return config


@pytest.mark.parametrize("source", list(SOURCES))
def test_same_files_are_cached_one_changed_file_reruns_and_dvc_reads_them(source, tiny_pipeline, tmp_path) -> None:
    dataset, one_file, deps = SOURCES[source](tmp_path / "src")
    pipeline = validate_pipeline(_pipeline(tiny_pipeline, dataset))
    assert dvc_stages(pipeline)["stages"]["acquire.media"]["deps"] == ["workspace/code/acquire.media.json", *deps]

    run = PipelineRun(pipeline, tmp_path / "ws")
    assert set(run.inputs["acquire.media"]["sources"]) == {SOURCE_FILES}
    assert run.execute("acquire.media").status == "ran"
    manifest = read_json(run.path("acquire.media") / "manifest.json")
    assert manifest["source"] == source and manifest["counts"]["bad"] == 0 and manifest["counts"]["train"] > 0
    assert PipelineRun(pipeline, tmp_path / "ws").execute("acquire.media").status == "cached"

    rebuilt = SOURCES[source](tmp_path / "other", 1)[1]  # the same item, other content
    one_file.write_bytes(rebuilt.read_bytes())
    changed = PipelineRun(pipeline, tmp_path / "ws")
    assert changed.fingerprints["acquire.media"] != run.fingerprints["acquire.media"]
    assert changed.execute("acquire.media").status == "ran"
