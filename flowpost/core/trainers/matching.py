"""Forward-process pieces shared by the flow-matching objectives (SFT, NFT, AWM, DPO)."""

from __future__ import annotations

from torch import Tensor


def noised(x0: Tensor, noise: Tensor, sigma: Tensor) -> Tensor:
    """``(1 - sigma) * x0 + sigma * noise`` with per-sample sigma [B]."""
    s = sigma.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
    return (1.0 - s) * x0 + s * noise


def matching_error(velocity: Tensor, noise: Tensor, x0: Tensor) -> Tensor:
    """Per-sample ``mean((v - (noise - x0))**2)`` over non-batch dimensions, in fp32: shape [B]."""
    return (velocity.float() - (noise.float() - x0.float())).pow(2).flatten(1).mean(1)


def flow_matching_loss(velocity: Tensor, noise: Tensor, x0: Tensor) -> Tensor:
    """Mean over all elements of ``(v - (noise - x0))**2``, computed in fp32."""
    return matching_error(velocity, noise, x0).mean()


def velocity_mse(velocity: Tensor, other: Tensor) -> Tensor:
    """Per-sample ``mean((v - v')**2)`` in fp32 (the v-space KL used as a regulariser): shape [B]."""
    return (velocity.float() - other.float()).pow(2).flatten(1).mean(1)
