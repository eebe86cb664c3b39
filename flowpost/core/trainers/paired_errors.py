"""The forward pass the DPO objectives share: both arms of each pair under one noise and noise level."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.models.base import ModelAdapter
from flowpost.core.trainers.matching import matching_error, noised


@dataclass(frozen=True)
class PairedErrors:
    """Matching errors [2, N] of the policy (with gradient) and of the reference; row 0 is the chosen arm.

    ``velocity`` and ``reference_velocity`` are the [2N, ...] predictions, chosen rows first.
    """

    policy: Tensor
    reference: Tensor
    velocity: Tensor
    reference_velocity: Tensor


def paired_errors(
    adapter: ModelAdapter,
    *,
    chosen: Tensor,
    rejected: Tensor,
    noise: Tensor,
    sigma: Tensor,
    conditions: ConditionBatch,
    reference: str,
) -> PairedErrors:
    """Noise both arms of the N pairs with the same ``noise`` [N, ...] and ``sigma`` [N] and compare the
    policy's and the ``reference`` snapshot's velocities with the flow-matching target.

    ``chosen`` and ``rejected`` are output states (latents) [N, ...]; ``conditions`` has N rows. Every
    tensor created takes the device and dtype of ``chosen``.
    """
    device = chosen.device
    x0 = torch.cat([chosen, rejected])
    noise = torch.cat([noise, noise]).to(device, x0.dtype)
    sigma = torch.cat([sigma, sigma]).to(device)
    state = adapter.prepare_condition_state(ConditionBatch.cat([conditions] * 2).to(device, x0.dtype))
    x = noised(x0, noise, sigma)
    with torch.no_grad(), adapter.use_snapshot(reference):
        v_ref = adapter.velocity(x, sigma, state)
    velocity = adapter.velocity(x, sigma, state)
    n = chosen.shape[0]
    return PairedErrors(
        policy=matching_error(velocity, noise, x0).view(2, n),
        reference=matching_error(v_ref, noise, x0).view(2, n),
        velocity=velocity,
        reference_velocity=v_ref,
    )
