"""The CUDA smoke of the default pipeline runs its stages and evaluation on the CPU here, from its own
workspace or from carried dataset and condition-cache folders, and a stage off the expected device fails."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cuda_smoke  # noqa: E402
from prepared import bench_pipeline, prepared_run  # noqa: E402

SMALL = [
    "stages.sft.train.batch_size=8",
    "stages.grpo.train.prompts_per_iteration=2",
    "stages.grpo.train.group_size=4",
    "stages.grpo.train.rollout_batch_size=8",
    "stages.grpo.train.train_batch_size=4",
]
ARGS = ["--sft-steps", "2", "--grpo-iterations", "2", "--eval-samples", "10", *(f"--set={s}" for s in SMALL)]


@pytest.mark.slow
def test_the_smoke_trains_and_evaluates_and_refuses_a_stage_off_its_device(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    assert cuda_smoke.main([*ARGS, "--workspace", str(workspace)]) == 0
    result = json.loads((workspace / "cuda_smoke.json").read_text())
    assert "failed" not in result and result["device"] == "cpu"
    for stage in cuda_smoke.STAGES:
        assert result[stage]["device"] == "cpu" and result[stage]["median_unit_s"] > 0
        assert math.isfinite(result[stage]["first_loss"]) and math.isfinite(result[stage]["last_loss"])
    assert 0 <= result["eval_sft"]["adherence"] <= 1 and result["eval_sft"]["fd"] > 0

    run = prepared_run(workspace, bench_pipeline({"sft": 2, "grpo": 2}, SMALL))  # the smoke's, reused
    dataset, conditions = run.path("acquire.digits"), run.path("conditions.minilm")
    carried = ["--dataset", str(dataset), "--conditions", str(conditions)]
    assert cuda_smoke.main([*ARGS, *carried, "--workspace", str(tmp_path / "elsewhere")]) == 0
    again = json.loads((tmp_path / "elsewhere" / "cuda_smoke.json").read_text())
    assert again["sft"]["first_loss"] == result["sft"]["first_loss"]  # the same data, conditions and seed

    prepared = cuda_smoke.Prepared(run.pipeline, dataset, conditions)
    with pytest.raises(RuntimeError, match=r"sft: trainer on cpu, weights on \{'cpu'\}; expected meta"):
        cuda_smoke.train(prepared, "sft", tmp_path / "off-device", torch.device("meta"))
