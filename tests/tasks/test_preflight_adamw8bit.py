"""``flowpost plan``'s memory estimate of an ``adamw8bit`` stage: the moments shrink from 8 bytes per trainable
fp32 value to about 2, and nothing else changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pretrained_stage import with_model
from tiny_flux1_pipeline import RESOLUTION

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.preflight import stage_memory


def _row(tiny_pipeline, folder: Path, lora: dict | None, **train: Any):  # noqa: ANN202
    model = {"family": "flux1", "pretrained": str(folder), "options": {"resolution": RESOLUTION}, "lora": lora}
    config = with_model(tiny_pipeline, model)
    config["stages"]["sft"]["train"].update(train)
    [row] = stage_memory(validate_pipeline(config))
    return row


@pytest.mark.parametrize("lora", [None, {"rank": 4}], ids=["full", "lora"])
def test_adamw8bit_cuts_the_optimizer_part_to_two_bytes_and_block_scales_per_value(
    tiny_pipeline, flux1_pipeline_dir: Path, lora: dict | None
) -> None:
    fp32 = _row(tiny_pipeline, flux1_pipeline_dir, lora)
    eight = _row(tiny_pipeline, flux1_pipeline_dir, lora, optimizer="adamw8bit")
    values = fp32.footprint.trainable
    assert fp32.estimate.optimizer == 2 * 4 * values  # two fp32 moments
    assert eight.estimate.optimizer == pytest.approx(values * 2 * (1 + 4 / 256))
    assert fp32.estimate.total - eight.estimate.total == pytest.approx(values * (8 - 2 * (1 + 4 / 256)))
