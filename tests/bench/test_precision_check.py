"""The bf16 precision check's tiny profile: replay ratio, dtypes and lr-1e-5 LoRA updates, on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import precision_check as bench  # noqa: E402


def test_the_tiny_profile_reports_fp32_updates_that_move_lora_over_a_bf16_base(tmp_path: Path) -> None:
    args = ["--shape", "tiny", "--families", "sd3", "--group", "2", "--steps", "3", "--workspace", str(tmp_path)]
    assert bench.main(args) == 0
    result = json.loads((tmp_path / "precision_check.json").read_text())["sd3"]
    assert result["max_abs_ratio_error"] < 1e-5
    assert result["trainable_dtypes"] == result["moment_dtypes"] == result["vae_dtypes"] == ["torch.float32"]
    assert result["frozen_dtypes"] == ["torch.bfloat16"]
    assert result["optimizer_steps"] == 3 and result["lora_A_changed"] > 0.5 and result["lora_B_changed"] > 0.5
    assert not (tmp_path / "precision_check" / "sd3").exists()
