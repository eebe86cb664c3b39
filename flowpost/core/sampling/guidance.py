"""Classifier-free guidance of velocities and Qwen-Image's norm rescale of it."""

from __future__ import annotations

import torch
from torch import Tensor


def classifier_free_guidance(v_pos: Tensor, v_neg: Tensor, scale: float) -> Tensor:
    """``v_neg + scale * (v_pos - v_neg)``."""
    return v_neg + scale * (v_pos - v_neg)


def rescaled_to_conditional_norm(guided: Tensor, v_pos: Tensor) -> Tensor:
    """``guided`` with each token's vector (the last dimension) scaled to the conditional velocity's norm:
    ``guided * |v_pos| / |guided|``, the rescale of the stock ``QwenImagePipeline``'s true CFG."""
    return guided * (torch.norm(v_pos, dim=-1, keepdim=True) / torch.norm(guided, dim=-1, keepdim=True))
