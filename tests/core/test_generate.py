"""The shared sampling helper: addressed noise, batching invariance, device and mode handling."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.evaluation.plan import EvalPlan, generate
from flowpost.core.models.base import ModelAdapter
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.noise import addressed_randn
from flowpost.core.sampling.generate import generate_images
from flowpost.core.sampling.ode import sample_ode
from flowpost.core.sampling.schedules import inference_sigmas

SMALL = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}


def _conditions(n: int, seed: int = 0) -> ConditionBatch:
    gen = torch.Generator().manual_seed(seed)
    return ConditionBatch(
        token_states=torch.randn(n, 16, 384, generator=gen),
        token_mask=torch.ones(n, 16, dtype=torch.int64),
        pooled=torch.randn(n, 384, generator=gen),
    )


def test_matches_a_direct_ode_integration_and_ignores_batching() -> None:
    adapter = TinySD3Adapter.from_scratch(seed=0, overrides=SMALL)
    adapter.module().eval()
    conditions, negative = _conditions(5), _conditions(1, seed=1)
    kwargs: dict[str, Any] = {"seed": 3, "stage": "eval", "steps": 3, "guidance": 2.0}
    whole = generate_images(adapter, conditions, negative, indices=range(5), **kwargs)
    chunked = generate_images(adapter, conditions, negative, indices=range(5), batch_size=2, **kwargs)
    noise = addressed_randn(adapter.latent_shape, seed=3, stage="eval", step=0, indices=range(5))
    with torch.no_grad():
        latents = sample_ode(
            adapter,
            noise,
            adapter.prepare_condition_state(conditions),
            inference_sigmas(3, shift=adapter.shift),
            guidance=2.0,
            negative=adapter.prepare_condition_state(negative.index([0] * 5)),
        )
    expected = adapter.decode(latents)
    torch.testing.assert_close(whole, expected)
    torch.testing.assert_close(chunked, expected, atol=1e-5, rtol=1e-5)


def test_eval_generate_uses_the_eval_noise_address() -> None:
    adapter = TinySD3Adapter.from_scratch(seed=0, overrides=SMALL)
    plan = EvalPlan(prompts=["a", "b"], samples=4, steps=2, guidance=1.0, seed=7, batch_size=3)
    conditions = _conditions(2)
    images = generate(adapter, plan, conditions, _conditions(1))
    expected = generate_images(
        adapter, conditions.index([0, 1, 0, 1]), None, indices=range(4), seed=7, stage="eval", steps=2, guidance=1.0
    )
    torch.testing.assert_close(images, expected, atol=1e-5, rtol=1e-5)
    other = generate_images(
        adapter, conditions.index([0, 1, 0, 1]), None, indices=range(4), seed=7, stage="sample", steps=2, guidance=1.0
    )
    assert not torch.allclose(images, other)


def test_train_mode_is_restored_even_when_sampling_fails() -> None:
    adapter = TinySD3Adapter.from_scratch(seed=0, overrides=SMALL)
    adapter.module().train()
    generate_images(adapter, _conditions(2), None, indices=[0, 1], seed=0, stage="s", steps=2, guidance=1.0)
    assert adapter.module().training
    with pytest.raises(ValueError, match="negative"):
        generate_images(adapter, _conditions(2), None, indices=[0, 1], seed=0, stage="s", steps=2, guidance=3.0)
    assert adapter.module().training


class _State(ConditionState):
    def __init__(self, pooled: Tensor) -> None:
        self.pooled = pooled

    def __len__(self) -> int:
        return int(self.pooled.shape[0])

    def index(self, rows: Tensor | list[int]) -> _State:
        return _State(self.pooled[torch.as_tensor(rows, dtype=torch.long)])

    @classmethod
    def cat(cls, states: Sequence[_State]) -> _State:
        return _State(torch.cat([s.pooled for s in states]))


class _DeviceRecordingAdapter(ModelAdapter):
    """Parameters on the ``meta`` device stand in for an accelerator; records where inputs live."""

    family = "fake"
    encoder_name = "none"
    shift = 1.0

    def __init__(self) -> None:
        self.net = torch.nn.Linear(1, 1, device="meta")
        self.seen: list[torch.device] = []
        self.modes: list[bool] = []

    def module(self) -> torch.nn.Module:
        return self.net

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return (1, 2, 2)

    def prepare_condition_state(self, batch: ConditionBatch) -> _State:
        self.seen += [batch.token_states.device, batch.token_mask.device, batch.pooled.device]
        return _State(batch.pooled)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        assert isinstance(state, _State)
        self.seen += [latents.device, state.pooled.device]
        self.modes.append(self.net.training)
        return torch.zeros_like(latents)

    def decode(self, latents: Tensor) -> Tensor:
        self.seen.append(latents.device)
        return torch.zeros(latents.shape)  # a real decode would stay on the model's device

    def encode_output_state(self, media: Tensor) -> Tensor:
        return media

    # unused by sampling
    @classmethod
    def from_scratch(cls, *, seed: int, shift: float = 1.0, overrides: dict | None = None) -> ModelAdapter:
        raise AssertionError("sampling never calls this")

    @classmethod
    def from_pretrained(cls, path: Any) -> ModelAdapter:
        raise AssertionError("sampling never calls this")

    def save_pretrained(self, path: Any) -> None:
        raise AssertionError("sampling never calls this")

    def add_lora(self, *, rank: int, alpha: float, targets: list[str] | None = None) -> None:
        raise AssertionError("sampling never calls this")

    def describe(self) -> dict:
        return {}

    def use_snapshot(self, name: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def test_noise_and_conditions_move_to_the_model_device_and_images_come_back_on_cpu() -> None:
    adapter = _DeviceRecordingAdapter()
    adapter.net.train()
    images = generate_images(
        adapter, _conditions(3), _conditions(1), indices=[4, 5, 6], seed=0, stage="s", steps=2, guidance=2.0
    )
    assert images.device.type == "cpu" and images.shape == (3, 1, 2, 2)
    assert adapter.seen and {d.type for d in adapter.seen} == {"meta"}
    assert adapter.modes and not any(adapter.modes) and adapter.net.training
