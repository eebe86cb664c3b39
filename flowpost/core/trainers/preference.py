"""Pure preference math shared by the DPO objectives: pairs from groups, the margin, the losses.

Errors are per-sample flow-matching errors ``e = <(v - (eps - x0))^2>`` of a chosen (``w``) and a
rejected (``l``) sample, noised with the same ``eps`` and ``sigma``. The margin is
``z = (e_ref^w - e_ref^l) - (e_theta^w - e_theta^l)``: positive when the policy fits the chosen sample
better, relative to the reference, than the rejected one.

Scale convention: ``beta`` is the Diffusion-DPO / Flow-GRPO ``beta`` and every loss uses
``b = beta / 2``: sigmoid ``-log sigmoid(b z)``, hinge ``max(0, 1 - b z)``, IPO ``(z - 1 / (2 b))^2``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

LossType = Literal["sigmoid", "hinge", "ipo"]


def preference_margin(
    policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor
) -> Tensor:
    """``z = (e_ref^w - e_ref^l) - (e_theta^w - e_theta^l)`` per pair, shape [N]."""
    return (ref_chosen - ref_rejected) - (policy_chosen - policy_rejected)


def preference_loss(margin: Tensor, *, beta: float, loss_type: LossType = "sigmoid") -> Tensor:
    """Per-pair loss of the margin ``z`` with scale ``b = beta / 2`` (see the module docstring), shape [N]."""
    scaled = 0.5 * beta * margin
    if loss_type == "sigmoid":
        return -F.logsigmoid(scaled)
    if loss_type == "hinge":
        return torch.relu(1.0 - scaled)
    if loss_type == "ipo":
        return (margin - 1.0 / beta) ** 2
    raise ValueError(f"unknown preference loss {loss_type!r}; expected sigmoid, hinge or ipo")


def implicit_rewards(
    policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, *, beta: float
) -> tuple[Tensor, Tensor]:
    """Implicit rewards ``-b (e_theta - e_ref)`` of the chosen and rejected arms, shape [N] each; their
    difference is ``b z``."""
    scale = 0.5 * beta
    return -scale * (policy_chosen - ref_chosen), -scale * (policy_rejected - ref_rejected)


def implicit_accuracy(margin: Tensor) -> Tensor:
    """Fraction of pairs with ``z > 0``; ties count one half (a scalar on the margin's device)."""
    return ((margin > 0).float() + 0.5 * (margin == 0).float()).mean()


def group_pairs(rewards: Tensor, group_ids: Tensor) -> tuple[list[int], list[int], Tensor]:
    """Rows of one (chosen, rejected) pair per group: the first argmax and the first argmin of the reward.

    Groups are keyed by ``group_ids`` (never by prompt strings), in order of first appearance. A group
    whose rewards are all equal (a group of one included) has no preference: its pair is the first row
    twice (``z = 0`` identically, so no gradient) and its entry of the returned boolean mask is False.
    """
    chosen: list[int] = []
    rejected: list[int] = []
    valid: list[bool] = []
    for group in dict.fromkeys(group_ids.tolist()):
        rows = torch.nonzero(group_ids == group).flatten()
        values = rewards[rows]
        chosen.append(int(rows[torch.argmax(values)]))
        rejected.append(int(rows[torch.argmin(values)]))
        valid.append(not bool((values == values[0]).all()))
    return chosen, rejected, torch.tensor(valid, dtype=torch.bool)
