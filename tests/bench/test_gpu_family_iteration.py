"""The GPU family-iteration benchmark: its full-size shapes are the released transformers', and its tiny
profile times, measures and counts a real GRPO iteration end to end (on the CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gpu_family_iteration as bench  # noqa: E402


def test_the_full_size_shapes_are_sd35_medium_and_flux1_dev() -> None:
    with torch.device("meta"):  # shapes only: nothing is allocated
        sd35 = bench.full_size_transformer("sd3", resolution=512)
        flux = bench.full_size_transformer("flux1", resolution=512)
    assert sd35.config.sample_size == 64 and sd35.config.pos_embed_max_size == 384
    assert round(sum(p.numel() for p in sd35.parameters()) / 1e9, 2) == 2.24
    assert round(sum(p.numel() for p in flux.parameters()) / 1e9, 1) == 11.9


def test_the_real_shape_needs_a_gpu_and_is_refused_on_the_cpu(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as refused:
        bench.main(["--workspace", str(tmp_path)])
    assert refused.value.code == 2 and "--shape real needs a CUDA device" in capsys.readouterr().err


def test_a_tiny_iteration_is_timed_measured_and_counted(tmp_path: Path) -> None:
    args = ["--shape", "tiny", "--families", "sd3", "--group", "2", "--steps", "3", "--iterations", "2"]
    assert bench.main([*args, "--workspace", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_family_iteration.json").read_text())["sd3"]
    assert len(result["iteration_seconds"]) == 1 and result["median_iteration_s"] > 0
    assert 0 < result["trainable_parameters"] < result["parameters"]  # LoRA on the frozen transformer
    # rollouts alone: 2 samples x 3 steps x 2 forwards (CFG) of the transformer, each at least 2 FLOPs a weight
    frozen = result["parameters"] - result["trainable_parameters"]
    assert result["flops_per_iteration"] > 2 * 3 * 2 * 2 * frozen
    assert 0 < result["mfu"] < 1
    assert result["peak_memory_bytes"] is None  # tracked on CUDA only
    assert not (tmp_path / "gpu_family_iteration" / "sd3").exists()  # its pipeline and weights deleted
