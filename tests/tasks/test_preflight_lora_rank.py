"""The memory preflight follows the LoRA rank: the adapters' parameters, gradients and AdamW moments, and the
rank-wide intermediates each adapted layer keeps for backward (what grew a rank-100,000 stage past 12 GB)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pretrained_stage import sft_adapter, with_model

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.preflight import StageMemory, stage_memory, text_tokens


def _row(tiny_pipeline, folder: Path, lora: dict[str, Any] | None) -> StageMemory:
    config = with_model(tiny_pipeline, {"family": "sd3", "pretrained": str(folder), "lora": lora})
    [row] = stage_memory(validate_pipeline(config))
    assert row.footprint is not None and row.estimate is not None, row.note
    return row


def test_the_trainable_bytes_and_the_activations_scale_with_the_rank(tiny_pipeline, sd3_pipeline_dir: Path) -> None:
    full, low, high = (_row(tiny_pipeline, sd3_pipeline_dir, lora) for lora in (None, {"rank": 4}, {"rank": 400}))
    assert high.footprint.trainable_bytes == 100 * low.footprint.trainable_bytes  # type: ignore[union-attr]
    for part in ("gradients", "optimizer"):
        assert getattr(high.estimate, part) == pytest.approx(100 * getattr(low.estimate, part))
    adapters = [row.estimate.activations - full.estimate.activations for row in (low, high)]  # type: ignore[union-attr]
    assert adapters[0] > 0 and adapters[1] == pytest.approx(100 * adapters[0])
    assert high.estimate.total > low.estimate.total + 99 * adapters[0]  # type: ignore[union-attr]


def test_the_rank_wide_activations_bound_what_the_adapters_keep_for_backward(
    tiny_pipeline, sd3_pipeline_dir: Path, tmp_path: Path
) -> None:
    """What autograd saves in a forward pass at rank 200 beyond rank 100 (the up-projections' inputs), measured on
    the loaded model, is at most the estimate's growth and at least half of it: the estimate lets every adapted
    layer see the image and the text tokens, and each of SD3's sees one of the two streams."""
    rows, saved = {}, {}
    for rank in (100, 200):
        lora = {"rank": rank}
        rows[rank] = _row(tiny_pipeline, sd3_pipeline_dir, lora)
        config = with_model(tiny_pipeline, {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "lora": lora})
        adapter = sft_adapter(config, tmp_path / str(rank))
        batch = int(config["stages"]["sft"]["train"]["batch_size"])
        tokens = text_tokens(validate_pipeline(config), validate_pipeline(config).stages["sft"])
        state = adapter.prepare_condition_state(_conditions(adapter, batch, tokens))
        latents = torch.randn(batch, *adapter.latent_shape)
        sizes: list[int] = []
        weights = {p.untyped_storage().data_ptr() for p in adapter.module().parameters()}

        def keep(tensor: torch.Tensor, sizes: list[int] = sizes, weights: set[int] = weights) -> torch.Tensor:
            if tensor.untyped_storage().data_ptr() not in weights:  # weights are counted as weights
                sizes.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            adapter.predict_velocity(latents, torch.rand(batch), state)
        saved[rank] = sum(sizes)
    measured = saved[200] - saved[100]
    estimated = rows[200].estimate.activations - rows[100].estimate.activations  # type: ignore[union-attr]
    assert estimated / 2 * (1 - 1e-9) <= measured <= estimated, (measured, estimated)


def _conditions(adapter: Any, batch: int, tokens: int) -> Any:
    from flowpost.core.conditions import ConditionBatch

    width = adapter.module().config.joint_attention_dim
    pooled = adapter.module().config.pooled_projection_dim
    return ConditionBatch(
        token_states=torch.randn(batch, tokens, width),
        token_mask=torch.ones(batch, tokens, dtype=torch.long),
        pooled=torch.randn(batch, pooled),
    )
