"""The per-GPU memory estimate against its closed forms: sharding, roles, snapshots, activations."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.transformers.transformer_flux2 import Flux2SingleTransformerBlock

from flowpost.core.live_bytes import LiveBytes
from flowpost.core.memory import (
    ACTIVATION_BYTES,
    ADAM_MOMENTS,
    SNAPSHOT_ITEMSIZE,
    SPLIT_GRADIENT_BUFFERS,
    estimate_memory,
)
from flowpost.core.models.footprint import ModelFootprint

FULL = ModelFootprint(
    parameters=1000, trainable=1000, weight_bytes=2000, trainable_bytes=2000,
    blocks=3, hidden=8, image_tokens=10, checkpointed=0,
)  # fmt: skip
LORA = ModelFootprint(
    parameters=1100, trainable=100, weight_bytes=2400, trainable_bytes=400,
    blocks=3, hidden=8, image_tokens=10, checkpointed=0,
)  # fmt: skip


def _estimate(footprint: ModelFootprint, **options: object):  # noqa: ANN202
    settings = {"world_size": 1, "backend": "ddp", "micro_batch": 1, "text_tokens": 6, "activation_itemsize": 2}
    return estimate_memory(footprint, **{**settings, **options})  # type: ignore[arg-type]


def test_full_fine_tuning_holds_weights_gradients_and_two_moments_in_the_parameters_dtype() -> None:
    estimate = _estimate(FULL, snapshots=1)
    assert (estimate.weights, estimate.gradients, estimate.optimizer) == (2000, 2000, ADAM_MOMENTS * 2000)
    assert estimate.snapshots == 1000 * SNAPSHOT_ITEMSIZE


def test_lora_trains_and_snapshots_the_adapters_only() -> None:
    estimate = _estimate(LORA, snapshots=2)
    assert estimate.weights == 2400 and estimate.gradients == 400 and estimate.optimizer == 800
    assert estimate.snapshots == 2 * 100 * SNAPSHOT_ITEMSIZE


def test_a_second_trainable_role_doubles_the_trainable_part_not_the_frozen_base() -> None:
    one, two = _estimate(LORA), _estimate(LORA, roles=2)
    assert two.weights - one.weights == 400 and two.gradients == 2 * one.gradients


@pytest.mark.parametrize(
    ("backend", "weights", "states"), [("ddp", 1.0, 1.0), ("deepspeed-zero2", 1.0, 1 / 8), ("fsdp2", 1 / 8, 1 / 8)]
)
def test_sharding_by_backend(backend: str, weights: float, states: float) -> None:
    one, eight = _estimate(FULL, snapshots=1), _estimate(FULL, snapshots=1, world_size=8, backend=backend)
    assert eight.weights == pytest.approx(one.weights * weights) and eight.snapshots == pytest.approx(
        one.snapshots * weights
    )
    assert eight.gradients == pytest.approx(one.gradients * states)
    assert eight.optimizer == pytest.approx(one.optimizer * states)


def test_activations_grow_with_tokens_and_batch_and_shrink_with_checkpointing() -> None:
    tokens = 10 + 6
    plain = _estimate(FULL, micro_batch=2)
    assert plain.activations == 2 * 3 * tokens * 8 * ACTIVATION_BYTES
    assert _estimate(FULL, micro_batch=2, activation_itemsize=4).activations == 2 * plain.activations
    checkpointed = ModelFootprint(**{**FULL.__dict__, "checkpointed": 3})  # every block: inputs + one block
    assert _estimate(checkpointed, micro_batch=2).activations == 2 * (
        3 * tokens * 8 * 2 + tokens * 8 * ACTIVATION_BYTES
    )
    one = ModelFootprint(**{**FULL.__dict__, "checkpointed": 1})  # the first block's input, the other two kept
    assert _estimate(one, micro_batch=2).activations == 2 * (tokens * 8 * 2 + 2 * tokens * 8 * ACTIVATION_BYTES)
    assert _estimate(checkpointed).activations < _estimate(one).activations < _estimate(FULL).activations


def test_adamw8bit_roles_keep_a_byte_per_moment_value_and_a_scale_per_block() -> None:
    fp32, one, both = (
        _estimate(FULL, roles=2),
        _estimate(FULL, roles=2, eight_bit_roles=1),
        _estimate(FULL, roles=2, eight_bit_roles=2, backend="deepspeed-zero2", world_size=2),
    )
    assert fp32.optimizer == 2 * ADAM_MOMENTS * 2000 and one.optimizer == ADAM_MOMENTS * 2000 + 1000 * 2 * (1 + 4 / 256)
    assert both.optimizer == 2 * 1000 * 2 * (1 + 4 / 256) / 2  # sharded like fp32 moments
    assert (one.weights, one.gradients, one.activations) == (fp32.weights, fp32.gradients, fp32.activations)


def test_the_vae_encode_and_the_transformers_activations_peak_one_after_the_other() -> None:
    """The encode's activations are freed before the forward: the peak holds the larger of the two, on top of
    what stays (weights, gradients, moments, the VAE)."""
    small, large = (
        _estimate(FULL, codec_bytes=500, codec_activation_bytes=10),
        _estimate(FULL, codec_bytes=500, codec_activation_bytes=10**6),
    )
    held = small.weights + small.gradients + small.optimizer + small.snapshots + 500
    assert small.codec_activations == 10 and small.total == held + small.activations
    assert large.total == held + 10**6 > held + large.activations


def test_backward_holds_the_widest_projections_output_gradients_on_top_of_the_kept_activations() -> None:
    """Three gradients of the widest projection's output per token (a fused projection's split), per sample; they
    add to the kept activations, and the VAE encode's peak still takes the larger of the two."""
    fused = ModelFootprint(**{**LORA.__dict__, "widest_projection": 72})  # nine times the width of 8
    tokens = 10 + 6
    one, two = _estimate(fused), _estimate(fused, micro_batch=2, activation_itemsize=4)
    assert one.backward_transient == SPLIT_GRADIENT_BUFFERS * tokens * 72 * 2
    assert two.backward_transient == 2 * 2 * one.backward_transient
    assert _estimate(LORA).backward_transient == 0  # no linear layer in its blocks
    held = one.weights + one.gradients + one.optimizer + one.snapshots
    assert one.total == held + one.activations + one.backward_transient
    encode = one.activations + one.backward_transient + 1
    assert _estimate(fused, codec_activation_bytes=encode).total == held + encode


def test_a_flux2_single_stream_blocks_backward_holds_two_to_three_of_its_fused_outputs_gradients() -> None:
    """What ``SPLIT_GRADIENT_BUFFERS`` stands for, run: backward through a FLUX.2 single-stream block (frozen bf16
    weights, as under LoRA) holds more than two and at most three gradients of its fused projection's output, with
    the block's input and output gradients beside them."""
    torch.manual_seed(0)
    block = Flux2SingleTransformerBlock(64, 2, 32).to(torch.bfloat16).requires_grad_(False)
    widest = max(layer.out_features for layer in block.modules() if isinstance(layer, torch.nn.Linear))
    hidden = torch.randn(2, 100, 64, dtype=torch.bfloat16, requires_grad=True)
    loss = block(hidden, None, torch.randn(2, 3 * 64, dtype=torch.bfloat16), text_seq_len=0).float().square().sum()
    with LiveBytes() as live:
        loss.backward()
    fused_gradient = hidden.shape[0] * hidden.shape[1] * widest * 2
    around = hidden.numel() * (4 + 2)  # the output's gradient in fp32, the input's in bf16
    assert widest == 9 * 64
    assert 2 * fused_gradient < live.peak <= SPLIT_GRADIENT_BUFFERS * fused_gradient + around
