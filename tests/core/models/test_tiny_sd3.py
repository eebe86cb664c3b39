from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from flowpost.core.conditions import ConditionBatch
from flowpost.core.models.base import ADAPTER_FILE
from flowpost.core.models.registry import adapter_class, load_adapter
from flowpost.core.models.tiny_sd3 import TinySD3Adapter, TinySD3State
from flowpost.errors import FlowpostError

SMALL: dict[str, Any] = {
    "num_layers": 1,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "caption_projection_dim": 16,
}
BATCH = 3
TOKENS = 16
WIDTH = 384


def _adapter(seed: int = 0, shift: float = 1.0) -> TinySD3Adapter:
    adapter = TinySD3Adapter.from_scratch(seed=seed, shift=shift, overrides=SMALL)
    adapter.module().eval()
    return adapter


def _conditions(seed: int, batch: int = BATCH) -> ConditionBatch:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, TOKENS, dtype=torch.int8)
    mask[:, TOKENS // 2 :] = 0  # padding must not matter
    return ConditionBatch(
        token_states=torch.randn(batch, TOKENS, WIDTH, generator=gen),
        token_mask=mask,
        pooled=torch.randn(batch, WIDTH, generator=gen),
    )


def _inputs(adapter: TinySD3Adapter, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, TinySD3State]:
    gen = torch.Generator().manual_seed(seed)
    latents = torch.randn(BATCH, *adapter.latent_shape, generator=gen)
    sigma = torch.rand(BATCH, generator=gen)
    return latents, sigma, adapter.prepare_condition_state(_conditions(seed + 100))


@pytest.fixture(scope="module")
def adapter() -> TinySD3Adapter:
    return _adapter()


def _perturb(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for param in module.parameters():
            param.add_(0.05)


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- construction ---------------------------------------------------------------------------------


def test_from_scratch_is_deterministic_per_seed() -> None:
    a = _weights(_adapter(seed=3).module())
    b = _weights(_adapter(seed=3).module())
    c = _weights(_adapter(seed=4).module())
    assert _same_weights(a, b)
    assert not _same_weights(a, c)


def test_from_scratch_leaves_global_rng_untouched() -> None:
    torch.manual_seed(77)
    state = torch.get_rng_state()
    _adapter(seed=0)
    assert torch.equal(torch.get_rng_state(), state)


def test_overrides_reach_the_transformer(adapter: TinySD3Adapter) -> None:
    config = adapter.module().config
    assert config.num_layers == 1
    assert config.num_attention_heads == 2
    assert config.attention_head_dim == 8
    assert adapter.latent_shape == (1, 16, 16)


def test_registry_resolves_family() -> None:
    assert adapter_class("tiny-sd3") is TinySD3Adapter
    with pytest.raises(FlowpostError, match="tiny-sd3"):
        adapter_class("nope", where="stages.sft.model.family")


def test_velocity_has_latent_shape_and_depends_on_inputs(adapter: TinySD3Adapter) -> None:
    latents, sigma, state = _inputs(adapter)
    with torch.no_grad():
        v = adapter.velocity(latents, sigma, state)
        other_sigma = adapter.velocity(latents, sigma * 0.5, state)
        other_state = adapter.velocity(latents, sigma, adapter.prepare_condition_state(_conditions(999)))
    assert v.shape == latents.shape
    assert torch.isfinite(v).all()
    assert not torch.allclose(v, other_sigma)
    assert not torch.allclose(v, other_state)


def test_scalar_sigma_broadcasts_like_per_sample_sigma(adapter: TinySD3Adapter) -> None:
    latents, _, state = _inputs(adapter)
    with torch.no_grad():
        scalar = adapter.velocity(latents, torch.tensor(0.4), state)
        per_sample = adapter.velocity(latents, torch.full((BATCH,), 0.4), state)
    torch.testing.assert_close(scalar, per_sample)


def test_condition_state_zeroes_padding_tokens(adapter: TinySD3Adapter) -> None:
    batch = _conditions(5)
    state = adapter.prepare_condition_state(batch)
    assert len(state) == BATCH
    assert torch.equal(state.encoder_hidden_states[:, TOKENS // 2 :], torch.zeros(BATCH, TOKENS // 2, WIDTH))
    assert torch.equal(state.encoder_hidden_states[:, : TOKENS // 2], batch.token_states[:, : TOKENS // 2])
    assert torch.equal(state.pooled_projections, batch.pooled)
    # what padded tokens held does not change the prediction
    noisy = ConditionBatch(token_states=batch.token_states.clone(), token_mask=batch.token_mask, pooled=batch.pooled)
    noisy.token_states[:, TOKENS // 2 :] += 10.0
    latents, sigma, _ = _inputs(adapter)
    with torch.no_grad():
        a = adapter.velocity(latents, sigma, state)
        b = adapter.velocity(latents, sigma, adapter.prepare_condition_state(noisy))
    assert torch.equal(a, b)


# -- save / load ----------------------------------------------------------------------------------


def test_save_and_load_adapter_give_identical_outputs(adapter: TinySD3Adapter, tmp_path: Path) -> None:
    shifted = _adapter(seed=2, shift=3.0)
    shifted.save_pretrained(tmp_path)
    assert (tmp_path / ADAPTER_FILE).exists()
    loaded = load_adapter(tmp_path)
    assert isinstance(loaded, TinySD3Adapter)
    assert loaded.shift == 3.0
    assert loaded.describe() == shifted.describe()
    assert _same_weights(_weights(loaded.module()), _weights(shifted.module()))
    latents, sigma, state = _inputs(shifted)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.velocity(latents, sigma, state),
            shifted.velocity(latents, sigma, state),
            rtol=0,
            atol=0,
        )


def test_diffusers_loader_reads_the_saved_transformer(adapter: TinySD3Adapter, tmp_path: Path) -> None:
    from diffusers import SD3Transformer2DModel

    adapter.save_pretrained(tmp_path)
    transformer = SD3Transformer2DModel.from_pretrained(tmp_path / "transformer")
    transformer.eval()
    latents, sigma, state = _inputs(adapter)
    with torch.no_grad():
        theirs = transformer(
            hidden_states=latents,
            encoder_hidden_states=state.encoder_hidden_states,
            pooled_projections=state.pooled_projections,
            timestep=sigma * 1000.0,
            return_dict=False,
        )[0]
        ours = adapter.module()(
            hidden_states=latents,
            encoder_hidden_states=state.encoder_hidden_states,
            pooled_projections=state.pooled_projections,
            timestep=sigma * 1000.0,
            return_dict=False,
        )[0]
        assert torch.equal(theirs, ours)
        assert torch.equal(theirs, adapter.velocity(latents, sigma, state))


def test_load_adapter_without_manifest_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(FlowpostError) as info:
        load_adapter(tmp_path)
    assert ADAPTER_FILE in str(info.value)


# -- guidance -------------------------------------------------------------------------------------


def test_forward_without_guidance_is_velocity(adapter: TinySD3Adapter) -> None:
    latents, sigma, state = _inputs(adapter)
    with torch.no_grad():
        torch.testing.assert_close(
            adapter.forward(latents, sigma, state, guidance=1.0),
            adapter.velocity(latents, sigma, state),
            rtol=0,
            atol=0,
        )


@pytest.mark.parametrize("guidance", [0.0, 2.5, 7.0])
def test_forward_with_guidance_combines_two_predictions(adapter: TinySD3Adapter, guidance: float) -> None:
    latents, sigma, state = _inputs(adapter)
    negative = adapter.prepare_condition_state(_conditions(321))
    with torch.no_grad():
        v_pos = adapter.velocity(latents, sigma, state)
        v_neg = adapter.velocity(latents, sigma, negative)
        guided = adapter.forward(latents, sigma, state, guidance=guidance, negative=negative)
    expected = v_neg + guidance * (v_pos - v_neg)
    torch.testing.assert_close(guided, expected, rtol=0, atol=1e-5)
    assert not torch.allclose(v_pos, v_neg)


def test_forward_with_guidance_and_scalar_sigma(adapter: TinySD3Adapter) -> None:
    latents, _, state = _inputs(adapter)
    negative = adapter.prepare_condition_state(_conditions(321))
    sigma = torch.tensor(0.7)
    with torch.no_grad():
        v_pos = adapter.velocity(latents, sigma, state)
        v_neg = adapter.velocity(latents, sigma, negative)
        guided = adapter.forward(latents, sigma, state, guidance=3.0, negative=negative)
    torch.testing.assert_close(guided, v_neg + 3.0 * (v_pos - v_neg), rtol=0, atol=1e-5)


def test_guidance_without_negative_raises(adapter: TinySD3Adapter) -> None:
    latents, sigma, state = _inputs(adapter)
    with pytest.raises(ValueError, match="negative"):
        adapter.forward(latents, sigma, state, guidance=4.0)


# -- snapshots ------------------------------------------------------------------------------------


def test_use_snapshot_swaps_weights_and_restores_live() -> None:
    adapter = _adapter(seed=5)
    latents, sigma, state = _inputs(adapter)
    adapter.snapshots.capture("ema", adapter.module())
    with torch.no_grad():
        captured_out = adapter.velocity(latents, sigma, state)
    _perturb(adapter.module())
    live = _weights(adapter.module())
    with torch.no_grad():
        live_out = adapter.velocity(latents, sigma, state)
    assert not torch.allclose(live_out, captured_out)

    with adapter.use_snapshot("ema") as swapped, torch.no_grad():
        assert swapped is adapter
        torch.testing.assert_close(adapter.velocity(latents, sigma, state), captured_out, rtol=0, atol=0)
    assert _same_weights(_weights(adapter.module()), live)
    with torch.no_grad():
        torch.testing.assert_close(adapter.velocity(latents, sigma, state), live_out, rtol=0, atol=0)


def test_use_snapshot_restores_live_weights_after_exception() -> None:
    adapter = _adapter(seed=6)
    adapter.snapshots.capture("ema", adapter.module())
    _perturb(adapter.module())
    live = _weights(adapter.module())
    with pytest.raises(RuntimeError, match="boom"), adapter.use_snapshot("ema"):
        assert not _same_weights(_weights(adapter.module()), live)
        raise RuntimeError("boom")
    assert _same_weights(_weights(adapter.module()), live)


def test_snapshot_is_a_copy_not_a_view() -> None:
    adapter = _adapter(seed=7)
    adapter.snapshots.capture("ref", adapter.module())
    before = {k: v.clone() for k, v in adapter.snapshots.state_dict("ref").items()}
    _perturb(adapter.module())
    after = adapter.snapshots.state_dict("ref")
    assert all(torch.equal(before[k], after[k]) for k in before)


# -- output codec ---------------------------------------------------------------------------------


def test_encode_and_decode_invert_each_other(adapter: TinySD3Adapter) -> None:
    gen = torch.Generator().manual_seed(0)
    media = torch.rand(4, 1, 16, 16, generator=gen)
    media[0, 0, 0, 0] = 0.0
    media[0, 0, 0, 1] = 1.0
    latents = adapter.encode_output_state(media)
    assert float(latents.min()) >= -1.0 and float(latents.max()) <= 1.0
    assert float(latents[0, 0, 0, 0]) == -1.0 and float(latents[0, 0, 0, 1]) == 1.0
    torch.testing.assert_close(adapter.decode(latents), media, rtol=0, atol=1e-6)
    torch.testing.assert_close(adapter.encode_output_state(adapter.decode(latents)), latents, rtol=0, atol=1e-6)


def test_decode_clamps_to_unit_interval(adapter: TinySD3Adapter) -> None:
    latents = torch.tensor([-3.0, -1.0, 0.0, 1.0, 2.5])
    torch.testing.assert_close(adapter.decode(latents), torch.tensor([0.0, 0.0, 0.5, 1.0, 1.0]))


def test_bf16_compute_keeps_fp32_weights_gradients_and_velocity() -> None:
    full, mixed = _adapter(), _adapter()
    mixed.compute_dtype = torch.bfloat16
    latents, sigma, state = _inputs(full)
    expected = full.velocity(latents, sigma, state)
    actual = mixed.velocity(latents, sigma, state)
    assert actual.dtype == torch.float32 and not torch.equal(actual, expected)  # computed in bf16, returned in fp32
    torch.testing.assert_close(actual, expected, rtol=0.05, atol=0.05)
    actual.square().mean().backward()
    params = list(mixed.module().parameters())
    assert all(p.dtype == torch.float32 for p in params)
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in params)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
