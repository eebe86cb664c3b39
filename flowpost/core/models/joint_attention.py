"""SD3's joint attention through diffusers' attention dispatch.

Diffusers' ``JointAttnProcessor2_0`` (SD3, SD3.5) calls torch's SDPA directly, so ``set_attention_backend``
cannot reach it. ``DispatchedJointAttention`` computes the same attention (image and text tokens attend
together, each stream with its own projections and norms) through ``dispatch_attention_fn``, whose
backend ``set_attention_backend`` sets.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class DispatchedJointAttention:
    """A joint-attention processor whose kernel is the backend diffusers' dispatch names (``_attention_backend``)."""

    _attention_backend: Any = None  # set by ``ModelMixin.set_attention_backend``
    _parallel_config: Any = None

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Tensor | tuple[Tensor, Tensor]:
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        def heads(projection: nn.Module, states: Tensor, norm: nn.Module | None) -> Tensor:
            split = projection(states).unflatten(-1, (attn.heads, -1))  # [B, S, heads, head_dim]
            return split if norm is None else norm(split)

        query = heads(attn.to_q, hidden_states, attn.norm_q)
        key = heads(attn.to_k, hidden_states, attn.norm_k)
        value = heads(attn.to_v, hidden_states, None)
        if encoder_hidden_states is not None:
            query = torch.cat([query, heads(attn.add_q_proj, encoder_hidden_states, attn.norm_added_q)], dim=1)
            key = torch.cat([key, heads(attn.add_k_proj, encoder_hidden_states, attn.norm_added_k)], dim=1)
            value = torch.cat([value, heads(attn.add_v_proj, encoder_hidden_states, None)], dim=1)
        joint = dispatch_attention_fn(query, key, value, backend=self._attention_backend)
        joint = joint.flatten(2).to(query.dtype)
        image_tokens = hidden_states.shape[1]
        image = attn.to_out[1](attn.to_out[0](joint[:, :image_tokens]))
        if encoder_hidden_states is None:
            return image
        text = joint[:, image_tokens:]
        return image, text if attn.context_pre_only else attn.to_add_out(text)


def dispatch_joint_attention(network: nn.Module) -> int:
    """Replace each of ``network``'s ``JointAttnProcessor2_0`` by a ``DispatchedJointAttention``; how many."""
    from diffusers.models.attention_processor import JointAttnProcessor2_0

    replaced = 0
    for module in network.modules():
        if isinstance(getattr(module, "processor", None), JointAttnProcessor2_0):
            module.set_processor(DispatchedJointAttention())  # type: ignore[operator]
            replaced += 1
    return replaced
