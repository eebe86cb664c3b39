"""``flowpost sample`` on every export flowpost writes: LoRA, merged transformer and whole pipeline, of a
pretrained family and of the tiny one; a base pipeline it cannot reach is one line saying what to do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_main import flowpost_main
from PIL import Image
from tiny_sd3_pipeline import load_sd3_adapter
from tiny_wan2_pipeline import load_wan2_adapter

from flowpost.core.evaluation.grid import make_grid
from flowpost.core.io import write_json_atomic
from flowpost.core.models.base import ADAPTER_FILE
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.models.transformer_adapter import TransformerAdapter
from flowpost.tasks.export import export_stage

N = 4


def _export(adapter: TransformerAdapter, root: Path, formats: tuple[str, ...] = ("diffusers",)) -> Path:
    """``adapter`` saved as a stage's live weights, then exported in ``formats``."""
    train_dir, out = root / "train", root / "export"
    adapter.save_pretrained(train_dir / "final" / "live")
    write_json_atomic(train_dir / "final" / "progress.json", {"optimizer_step": 1})
    out.mkdir()
    export_stage(
        stage="s",
        train_dir=train_dir,
        out_dir=out,
        weights="live",
        resolved_config={"name": "sample-exports"},
        fingerprints={},
        formats=formats,
    )
    return out


def _sample(export: Path, out: Path, *extra: str) -> Any:
    return flowpost_main(
        "sample", str(export), "--prompt", "a red cat", "-n", str(N), "--steps", "2", "--out", str(out), *extra
    )


def _assert_grid(result: Any, grid: Path, shape: tuple[int, ...]) -> None:
    """The command succeeded and wrote a PNG of ``N`` tiles of ``shape`` (C, [T,] H, W), two a row."""
    assert result.code == 0, result.stderr
    assert str(grid) in result.stdout
    with Image.open(grid) as image:
        assert image.format == "PNG"
        assert image.size == make_grid(torch.zeros(N, *shape), nrow=2).size


def _one_line_error(result: Any, export: Path) -> str:
    assert result.code == 1 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {export}: ")
    return line


@pytest.fixture
def base_dir(sd3_pipeline_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny sd3 pipeline this test may move away."""
    return Path(shutil.copytree(sd3_pipeline_dir, tmp_path / "base"))


@pytest.mark.parametrize(
    "formats, lora",
    [(("diffusers",), True), (("diffusers",), False), (("diffusers", "pipeline"), True)],
    ids=["lora", "merged-transformer", "pipeline"],
)
def test_sample_generates_from_each_sd3_export_format(base_dir: Path, tmp_path: Path, formats, lora: bool) -> None:
    adapter = load_sd3_adapter(base_dir)
    if lora:
        adapter.add_lora(rank=2, alpha=4.0)
    export = _export(adapter, tmp_path, formats)
    _assert_grid(_sample(export, tmp_path / "grid.png"), tmp_path / "grid.png", (3, 16, 16))
    if "pipeline" in formats:  # the whole pipeline samples on its own, without its base
        shutil.rmtree(base_dir)
        _assert_grid(_sample(export, tmp_path / "alone.png"), tmp_path / "alone.png", (3, 16, 16))


def test_an_export_without_a_scheduler_folder_takes_its_bases(base_dir: Path, tmp_path: Path) -> None:
    export = _export(load_sd3_adapter(base_dir), tmp_path)
    shutil.rmtree(export / "scheduler")  # as exports written before it was copied
    _assert_grid(_sample(export, tmp_path / "grid.png"), tmp_path / "grid.png", (3, 16, 16))


def test_a_moved_base_pipeline_is_one_line_and_base_points_at_it(base_dir: Path, tmp_path: Path) -> None:
    export = _export(load_sd3_adapter(base_dir), tmp_path)
    moved = base_dir.rename(tmp_path / "moved")
    line = _one_line_error(_sample(export, tmp_path / "grid.png"), export)
    assert f"{base_dir} does not exist" in line and "--base" in line and "formats: [diffusers, pipeline]" in line
    assert not (tmp_path / "grid.png").exists()
    _assert_grid(_sample(export, tmp_path / "grid.png", "--base", str(moved)), tmp_path / "grid.png", (3, 16, 16))


def test_a_hub_base_not_in_the_offline_cache_is_one_line(base_dir: Path, tmp_path: Path) -> None:
    export = _export(load_sd3_adapter(base_dir), tmp_path)
    manifest = json.loads((export / ADAPTER_FILE).read_text())
    manifest["pretrained"]["path"] = "flowpost-tests/no-such-pipeline"
    write_json_atomic(export / ADAPTER_FILE, manifest)
    line = _one_line_error(_sample(export, tmp_path / "grid.png"), export)
    assert "flowpost-tests/no-such-pipeline is neither a folder here nor a hub pipeline in the local cache" in line
    assert "--base" in line


@pytest.mark.parametrize("family", ["wan2", "wan22-a14b"])
def test_sample_generates_from_a_wan_export(request: pytest.FixtureRequest, tmp_path: Path, family: str) -> None:
    folder = request.getfixturevalue("wan2_pipeline_dir" if family == "wan2" else "wan22_pipeline_dir")
    adapter = load_wan2_adapter(folder, family=family)
    adapter.add_lora(rank=2, alpha=4.0)
    export = _export(adapter, tmp_path)
    frames = (3, adapter.num_frames, adapter.height, adapter.width)
    _assert_grid(_sample(export, tmp_path / "frames.png"), tmp_path / "frames.png", frames)


def test_sample_generates_from_a_tiny_export_and_refuses_base(tmp_path: Path) -> None:
    adapter = TinySD3Adapter.from_scratch(seed=0, overrides={"num_layers": 1})
    adapter.add_lora(rank=2, alpha=4.0)
    export = _export(adapter, tmp_path)
    _assert_grid(_sample(export, tmp_path / "grid.png"), tmp_path / "grid.png", (1, *adapter.latent_shape[1:]))
    result = _sample(export, tmp_path / "other.png", "--base", str(tmp_path))
    assert result.code == 1 and "--base" in result.stderr and "drop --base" in result.stderr
