"""The memory preflight with ``offload``: offloaded snapshots and VAE leave the per-GPU total and count as host
memory, per stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.memory import SNAPSHOT_ITEMSIZE
from flowpost.tasks.preflight import COLUMNS, cells, stage_memory

SD35 = Path(__file__).parents[2] / "docs" / "shapes" / "sd3.5-medium"


def _pipeline(tmp_path: Path) -> dict[str, Any]:
    """SD3.5-Medium's published shape fully fine-tuned by GRPO with a reference and an EMA, once resident and once
    with both snapshots and the VAE offloaded."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\n")
    source = {"family": "sd3", "pretrained": str(SD35)}
    stage = {
        "trainer": "grpo",
        "model": {**source, "torch_dtype": "bfloat16"},
        "data": {"dataset": "prompts", "conditions": "sd3"},
        "rewards": [{"name": "jpeg_compressibility"}],
        "train": {"iterations": 1, "prompts_per_iteration": 1, "group_size": 2, "train_batch_size": 1, "kl_beta": 0.04},
        "callbacks": {"ema": {"decay": 0.99}},
        "launch": {"mixed_precision": "bf16"},
    }
    return {
        "name": "offload",
        "datasets": {"prompts": {"source": "prompt-files", "path": str(prompts)}},
        "conditions": {"sd3": {"model": source, "datasets": ["prompts"]}},
        "stages": {"resident": stage, "offloaded": {**stage, "offload": ["ref", "ema", "vae"]}},
        "evaluate": {"after": []},
    }


def test_offloaded_snapshots_and_vae_leave_the_device_total_and_count_as_host_memory(tmp_path: Path) -> None:
    rows = {row.stage: row for row in stage_memory(validate_pipeline(_pipeline(tmp_path)))}
    resident, offloaded = rows["resident"].estimate, rows["offloaded"].estimate
    footprint = rows["offloaded"].footprint
    assert resident is not None and offloaded is not None and footprint is not None
    snapshots = 2 * footprint.trainable * SNAPSHOT_ITEMSIZE  # ref and ema: fp32 copies of 2.24 B weights
    assert resident.snapshots == snapshots and resident.codec > 0 and resident.host == 0
    assert offloaded.snapshots == 0 and offloaded.codec == 0
    assert offloaded.host == snapshots + resident.codec
    assert resident.total - offloaded.total == offloaded.host
    assert round(offloaded.host / 1024**3, 1) == 17.0  # 2 x 2.24 B x 4 bytes + the 0.31 GiB VAE
    host = COLUMNS.index("host")
    assert cells(rows["offloaded"])[host] == "17.0" and cells(rows["resident"])[host] == "0.0"
