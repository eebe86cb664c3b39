"""DMD2's optional GAN term: a classifier on the fake score's middle-block features.

The fake-score network doubles as the discriminator's body: a forward hook keeps the image-token output
of its middle repeated transformer block, the tokens are averaged, and a small head (Linear, SiLU,
Linear) turns them into one realism logit per sample. The head is a submodule of the fake-score
network (``gan_head``), so the fake score's optimizer trains it and checkpoints hold it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from flowpost.core.conditions import ConditionState
from flowpost.core.config.base import StrictModel
from flowpost.core.models.compile import repeated_block_classes
from flowpost.core.trainers.distill.scores import ScorePair
from flowpost.errors import FlowpostError

HEAD_NAME = "gan_head"  # the head's name inside the fake-score network (and its checkpoint keys)


class GANConfig(StrictModel):
    """``train.gan`` of a DMD2 stage: the weights of the two GAN losses (DMD2's SDXL values by default)."""

    generator_weight: float = Field(5e-3, ge=0, description="weight of softplus(-D(fake)) in the generator loss")
    discriminator_weight: float = Field(
        1e-2, ge=0, description="weight of softplus(-D(real)) + softplus(D(fake)) in the fake-score loss"
    )


def discriminator_loss(real_logits: Tensor, fake_logits: Tensor) -> Tensor:
    """``<softplus(-D(real))> + <softplus(D(fake))>`` in fp32: the logistic loss of telling them apart."""
    return F.softplus(-real_logits.float()).mean() + F.softplus(fake_logits.float()).mean()


def generator_gan_loss(fake_logits: Tensor) -> Tensor:
    """``<softplus(-D(fake))>`` in fp32: the non-saturating generator loss."""
    return F.softplus(-fake_logits.float()).mean()


def middle_block(network: nn.Module, *, where: str) -> nn.Module:
    """The middle one of ``network``'s repeated transformer blocks (the lower middle for an even count)."""
    classes = repeated_block_classes(network)
    blocks = [module for module in network.modules() if type(module).__name__ in classes]
    if not blocks:
        raise FlowpostError(
            f"{type(network).__name__} has no repeated transformer blocks to take GAN features from; remove train.gan",
            where=where,
        )
    return blocks[(len(blocks) - 1) // 2]


class DiscriminatorHead(nn.Module):
    """Token-averaged features [B, tokens, width] -> one logit per sample [B] (fp32)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, 1))

    def forward(self, features: Tensor) -> Tensor:
        return self.layers(features.float().mean(1)).squeeze(1)


class BlockFeatures:
    """Keeps the image-token output of one block (a tuple's last element) while ``capturing``."""

    def __init__(self, block: nn.Module) -> None:
        self._active = False
        self._features: Tensor | None = None
        block.register_forward_hook(self._keep)

    def _keep(self, module: nn.Module, inputs: object, output: Tensor | tuple[Tensor | None, ...]) -> None:
        if self._active:
            self._features = output[-1] if isinstance(output, tuple) else output

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        self._active, self._features = True, None
        try:
            yield
        finally:
            self._active = False

    def taken(self) -> Tensor:
        """The features the last capture kept (once)."""
        features, self._features = self._features, None
        if features is None:
            raise RuntimeError("the hooked block did not run during the capture")
        return features


class Discriminator:
    """``logits(x, sigma, state)``: the fake-score network's middle-block features of ``x``, through the head."""

    def __init__(self, scores: ScorePair, network: nn.Module, *, seed: int, where: str) -> None:
        self.scores = scores
        self.features = BlockFeatures(middle_block(network, where=where))
        config = network.config  # type: ignore[attr-defined]
        width = int(config.num_attention_heads) * int(config.attention_head_dim)
        with torch.random.fork_rng(devices=[]):  # every rank builds the same head; the global RNG is untouched
            torch.manual_seed(seed)
            head = DiscriminatorHead(width)
        device = next(network.parameters()).device
        network.add_module(HEAD_NAME, head.to(device))
        self.head = head

    def logits(self, x: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        with self.features.capturing():
            self.scores.fake_velocity(x, sigma, state)
        return self.head(self.features.taken())
