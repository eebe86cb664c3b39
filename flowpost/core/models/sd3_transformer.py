"""What the families built on ``SD3Transformer2DModel`` share (sd3, tiny-sd3): the condition state,
latent shape and velocity call."""

from __future__ import annotations

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionState
from flowpost.core.models.text_state import TextState
from flowpost.core.models.transformer_adapter import TransformerAdapter


class SD3TransformerAdapter(TransformerAdapter):
    """An ``SD3Transformer2DModel`` as the trainable network; subclasses add conditions and the output codec."""

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        config = self.transformer.config
        return (config.in_channels, config.sample_size, config.sample_size)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer at ``timestep = sigma * 1000``, as the stock pipeline calls it, in the latents' dtype."""
        assert isinstance(state, TextState)
        sigma = torch.as_tensor(sigma, dtype=latents.dtype, device=latents.device).expand(latents.shape[0])
        return self.transformer(
            hidden_states=latents,
            encoder_hidden_states=state.encoder_hidden_states.to(device=latents.device, dtype=latents.dtype),
            pooled_projections=state.pooled_projections.to(device=latents.device, dtype=latents.dtype),
            timestep=sigma * 1000.0,
            return_dict=False,
        )[0]
