"""What a metric scores: generated images with their prompts, and the held-out real images."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from torch import Tensor

Better = Literal["higher", "lower"]  # the direction in which a metric's value is better


@dataclass(frozen=True)
class EvalSamples:
    """``images`` [N, C, H, W] in [0, 1], one prompt and metadata dict per image; ``reference`` holds the
    evaluation dataset's held-out real images [M, C, H, W] (None when it has none)."""

    images: Tensor
    prompts: list[str]
    metadata: list[dict[str, Any]]
    reference: Tensor | None = None

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or not len(self.prompts) == len(self.metadata) == self.images.shape[0]:
            raise ValueError(
                f"{tuple(self.images.shape)} images need [N, C, H, W] and one prompt and metadata dict each, "
                f"got {len(self.prompts)} prompts and {len(self.metadata)} metadata dicts"
            )

    def groups(self) -> list[list[int]]:
        """Sample indices per distinct prompt, in order of first appearance."""
        found: dict[str, list[int]] = {}
        for index, prompt in enumerate(self.prompts):
            found.setdefault(prompt, []).append(index)
        return list(found.values())


class Metric(Protocol):
    """Scores a set of samples with one number. A class may declare ``better`` (:data:`Better`): the direction
    gates and guards take for it when their config leaves it out. One that also gives each sample's score
    (``scores(samples) -> Tensor [N]``, whose mean is its number; every reward does) gets per-category means
    and is compared with the base model sample by sample."""

    name: str

    def __call__(self, samples: EvalSamples) -> float: ...
