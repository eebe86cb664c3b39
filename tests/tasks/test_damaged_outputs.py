"""Files a completed node hands on are hashed into its manifest; damage is refused downstream and rebuilt."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flowpost.core.config.loading import validate_pipeline
from flowpost.data.condition_cache import load_condition_table
from flowpost.errors import FlowpostError
from flowpost.tasks.integrity import COMPLETE
from flowpost.tasks.plan import plan_run
from flowpost.tasks.runner import PipelineRun

WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


@pytest.fixture
def run(completed_workspace: tuple[Path, dict[str, str]], tmp_path: Path, tiny_pipeline) -> PipelineRun:
    """A copy of the completed workspace, free to damage."""
    shutil.copytree(completed_workspace[0], tmp_path / "ws")
    return PipelineRun(validate_pipeline(tiny_pipeline()), tmp_path / "ws")


def _nan_tensors(path: Path) -> None:
    """Overwrite every tensor value of a safetensors file with NaN, keeping its header."""
    data = path.read_bytes()
    start = 8 + struct.unpack("<Q", data[:8])[0]
    path.write_bytes(data[:start] + np.full((len(data) - start) // 4, np.nan, np.float32).tobytes())


def test_each_node_records_the_files_it_hands_on(run: PipelineRun) -> None:
    files = {node: json.loads((run.path(node) / COMPLETE).read_text())["files"] for node in run.nodes}
    assert sorted(files["conditions.minilm"]) == ["conditions.parquet", "encoder.json", "manifest.json"]
    assert {"stage.json", f"final/ema/{WEIGHTS}", f"final/live/{WEIGHTS}", "final/progress.json"} <= set(
        files["train.sft"]
    )
    assert not [name for name in files["train.sft"] if not name.startswith("final/") and name != "stage.json"]
    assert "train/shard-000000.tar" in files["acquire.digits"] and WEIGHTS in files["export"]
    assert [run.damage(node) for node in run.nodes] == [None] * len(run.nodes)


def test_a_corrupted_condition_cache_is_refused_then_rebuilt(run: PipelineRun) -> None:
    cache = run.path("conditions.minilm")
    parquet = cache / "conditions.parquet"
    original = parquet.read_bytes()
    middle = len(original) // 2
    parquet.write_bytes(original[:middle] + bytes([original[middle] ^ 0xFF]) + original[middle + 1 :])

    plan = {row.node: row for row in plan_run(run)}
    assert plan["conditions.minilm"].status == "damaged"
    assert plan["conditions.minilm"].reason == (
        "conditions.parquet does not match its recorded sha256 since it completed; a run rebuilds it"
    )
    stage_before = sorted(p.relative_to(run.path("train.sft")) for p in run.path("train.sft").rglob("*"))
    with pytest.raises(FlowpostError) as refused:
        run.execute("train.sft", force=True)
    assert str(refused.value) == (
        f"{cache}: node train.sft needs conditions.minilm, which is damaged: conditions.parquet does not match "
        "its recorded sha256 since it completed; rebuild it with `flowpost run` (it reruns damaged nodes) or "
        "`flowpost run-node conditions.minilm`"
    )
    assert sorted(p.relative_to(run.path("train.sft")) for p in run.path("train.sft").rglob("*")) == stage_before
    with pytest.raises(FlowpostError, match="condition cache is damaged"):  # read directly, the cache refuses too
        load_condition_table(cache, "any")

    assert run.execute("conditions.minilm").status == "ran"
    assert parquet.read_bytes() == original and run.damage("conditions.minilm") is None


def test_zeroed_final_weights_are_refused_downstream_then_rebuilt_from_the_last_checkpoint(run: PipelineRun) -> None:
    weights = run.path("train.sft") / "final" / "ema" / WEIGHTS
    original = weights.read_bytes()
    weights.write_bytes(bytes(len(original)))
    for node in ("eval.sft", "export"):
        with pytest.raises(FlowpostError, match=f"needs train.sft, which is damaged: final/ema/{WEIGHTS} does not"):
            run.execute(node, force=True)
    assert run.execute("train.sft").status == "ran"  # a cache hit would have read the zeros
    assert weights.read_bytes() == original
    assert run.execute("eval.sft").status == "cached"


def test_nan_weights_in_an_export_are_refused_by_the_report_and_by_sample(run: PipelineRun, tmp_path: Path) -> None:
    from flowpost.cli import app

    export = run.path("export")
    _nan_tensors(export / WEIGHTS)
    with pytest.raises(FlowpostError, match=f"needs export, which is damaged: {WEIGHTS} does not match"):
        run.execute("report", force=True)
    sampled = CliRunner().invoke(app, ["sample", str(export), "--prompt", "a digit", "--out", str(tmp_path / "g.png")])
    assert sampled.exit_code == 1 and not (tmp_path / "g.png").exists()
    assert str(sampled.exception) == (
        f"{export}: export is damaged: {WEIGHTS} does not match its recorded sha256 since it completed; "
        "rebuild it with `flowpost run` (it reruns damaged nodes) or `flowpost run-node export`"
    )
