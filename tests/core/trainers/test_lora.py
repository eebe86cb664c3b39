"""LoRA fine-tuning: only adapters train, snapshots hold adapters, exports are merged diffusers folders."""

from __future__ import annotations

import torch


def _velocity(module: torch.nn.Module) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1, 16, 16, generator=generator)
    states = torch.randn(2, 16, 384, generator=generator)
    pooled = torch.randn(2, 384, generator=generator)
    with torch.no_grad():
        return module(
            hidden_states=x,
            encoder_hidden_states=states,
            pooled_projections=pooled,
            timestep=torch.tensor([700.0, 200.0]),
        ).sample


def test_sft_with_lora_trains_only_adapters_and_exports_merged_weights(make_trainer, fresh_weights, tmp_path):
    from diffusers import SD3Transformer2DModel

    trainer = make_trainer(tmp_path, lora_rank=4, max_steps=3, callbacks={"ema": {"decay": 0.5}})
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    trainer.start()

    state = trainer.adapter.module().state_dict()
    for key, initial in fresh_weights.items():  # frozen base weights did not move
        base_key = key.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        assert torch.equal(state.get(key, state.get(base_key)), initial), key
    assert set(trainer.adapter.snapshots.state_dict("ema")) == trainable

    exported = SD3Transformer2DModel.from_pretrained(tmp_path / "final" / "live" / "transformer").eval()
    assert not any("lora" in key for key in exported.state_dict())
    live = trainer.adapter.module().eval()
    torch.testing.assert_close(_velocity(exported), _velocity(live), atol=1e-5, rtol=1e-4)
    untrained = SD3Transformer2DModel.from_config(live.config).eval()
    untrained.load_state_dict(fresh_weights)
    assert not torch.allclose(_velocity(exported), _velocity(untrained), atol=1e-4)  # the merge carries training
