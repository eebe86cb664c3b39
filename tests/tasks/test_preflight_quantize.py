"""The memory preflight counts a quantized frozen base (``model.quantize``) at its stored bytes: one per weight
of the repeated blocks' Linear layers plus one fp32 scale per row, instead of the weight's dtype."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pretrained_stage import with_model
from test_preflight import _shape_pipeline

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.base import ModelAdapter
from flowpost.core.models.compile import repeated_blocks
from flowpost.core.models.footprint import model_footprint
from flowpost.core.models.precision import upcast_trainable
from flowpost.core.trainers.spec import StageSpec
from flowpost.stage import build_adapter
from flowpost.tasks.preflight import StageMemory, stage_memory

SCALE_BYTES = 4  # one fp32 scale per output row


def _saving(network: torch.nn.Module) -> int:
    """The bytes an 8-bit base saves over ``network``'s own: each block Linear weight's dtype bytes less one
    byte per weight and its rows' scales."""
    linears = [m for b in repeated_blocks(network) for m in b.modules() if isinstance(m, torch.nn.Linear)]
    weights = [m.weight for m in linears if not m.weight.requires_grad]  # not the adapters' own Linear layers
    return sum(w.numel() * (w.element_size() - 1) - w.shape[0] * SCALE_BYTES for w in weights)


def _rows(config: dict[str, Any], stage: str, kinds: tuple[str, ...]) -> list[StageMemory]:
    rows = []
    for kind in kinds:
        config["stages"][stage]["model"]["quantize"] = kind
        [row] = stage_memory(validate_pipeline(config))
        assert row.footprint is not None and row.estimate is not None, row.note
        rows.append(row)
    return rows


def _built(config: dict[str, Any], out: Path) -> ModelAdapter:
    """The stage's model as a rank builds it, its adapters in fp32 as the trainer keeps them."""
    adapter = build_adapter(
        validate_pipeline(config).stages["sft"], StageSpec(stage="sft", seed=0, config={}, output_dir=str(out))
    )
    upcast_trainable(adapter.trainable_network())
    return adapter


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_the_estimate_drops_by_the_quantized_weights_bytes(tiny_pipeline, sd3_pipeline_dir: Path, tmp_path, kind):
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "torch_dtype": "bfloat16", "lora": {"rank": 4}}
    config = with_model(tiny_pipeline, model)
    expected = _saving(_built(config, tmp_path / "plain").module())
    plain, quantized = _rows(config, "sft", ("none", kind))
    assert quantized.footprint == model_footprint(_built(config, tmp_path / "quantized"))  # the loaded model's
    assert expected > 0 and quantized.fine_tune == f"LoRA r4, {kind} base"
    assert plain.footprint.weight_bytes - quantized.footprint.weight_bytes == expected  # type: ignore[union-attr]
    assert plain.estimate.total - quantized.estimate.total == expected  # type: ignore[union-attr]
    assert quantized.footprint.trainable_bytes == plain.footprint.trainable_bytes  # type: ignore[union-attr]


def test_the_published_flux_shape_over_an_int8_base_saves_almost_half_its_frozen_bytes(tmp_path: Path) -> None:
    config = _shape_pipeline(tmp_path, {"rank": 32})
    bf16, int8 = _rows(config, "grpo", ("none", "int8"))
    frozen = bf16.footprint.weight_bytes - bf16.footprint.trainable_bytes  # type: ignore[union-attr]
    saved = bf16.estimate.weights - int8.estimate.weights  # type: ignore[union-attr]
    assert 0.45 * frozen < saved < 0.5 * frozen  # the blocks hold nearly all weights; 8 bits of 16, plus scales
    assert bf16.estimate.total - int8.estimate.total == saved  # type: ignore[union-attr]
