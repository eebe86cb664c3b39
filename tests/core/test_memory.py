"""The per-GPU memory estimate against its closed forms: sharding, roles, snapshots, activations."""

from __future__ import annotations

import pytest

from flowpost.core.memory import ACTIVATION_BYTES, ADAM_MOMENTS, SNAPSHOT_ITEMSIZE, estimate_memory
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
