"""Typed records that acquisition writes and loaders read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PromptRecord:
    """A prompt with free-form metadata."""

    prompt: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Demonstration:
    """A prompt and its target image, float32 [C, H, W], or clip, float32 [C, T, H, W], with values in [0, 1].

    Compared by identity: the image is an array.
    """

    key: str
    prompt: str
    image: np.ndarray
    label: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_key(self.key)
        _check_image(self.key, "image", self.image)


@dataclass(frozen=True, eq=False)
class PreferencePair:
    """A prompt, a preferred (``chosen``) and a dispreferred (``rejected``) image of the same shape.

    Images are float32 [C, H, W] in [0, 1]. Compared by identity: the images are arrays.
    """

    key: str
    prompt: str
    chosen: np.ndarray
    rejected: np.ndarray
    label: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_key(self.key)
        _check_image(self.key, "chosen", self.chosen)
        _check_image(self.key, "rejected", self.rejected)
        if self.chosen.shape != self.rejected.shape:
            raise ValueError(
                f"record {self.key!r}: chosen {tuple(self.chosen.shape)} and rejected "
                f"{tuple(self.rejected.shape)} differ in shape"
            )


@dataclass(frozen=True, eq=False)
class EditPair:
    """An edit: an ``instruction``, the ``source`` image it applies to and the ``target`` image it should give,
    float32 [C, H, W] in [0, 1] of the same shape; ``more_sources``, further source images of that shape the
    instruction names after the first (Picture 2, 3, ...). Compared by identity: the images are arrays.

    Acquisition keeps the source beside the shards (``assets/sources/<digest>.png``) and stores the pair as a
    ``Demonstration`` of the target whose prompt names the instruction and the source's digest
    (``core/edit_prompts.py``): the prompt keys the edit's cached conditions, which hold the source's latents.
    """

    key: str
    instruction: str
    source: np.ndarray
    target: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)
    more_sources: tuple[np.ndarray, ...] = ()

    def __post_init__(self) -> None:
        _check_key(self.key)
        _check_image(self.key, "target", self.target)
        for number, source in enumerate(self.sources, start=1):
            name = "source" if number == 1 else f"source {number}"
            _check_image(self.key, name, source)
            if source.shape != self.target.shape:
                raise ValueError(
                    f"record {self.key!r}: {name} {tuple(source.shape)} and target {tuple(self.target.shape)} "
                    "differ in shape"
                )

    @property
    def sources(self) -> tuple[np.ndarray, ...]:
        """Every source image, in order."""
        return (self.source, *self.more_sources)


def _check_key(key: str) -> None:
    if not key or "." in key:
        raise ValueError(f"record key {key!r} must be non-empty and contain no dots")


def _check_image(key: str, name: str, image: np.ndarray) -> None:
    if image.dtype != np.float32 or image.ndim not in (3, 4):
        raise ValueError(
            f"record {key!r}: {name} must be float32 [C, H, W] (a clip: [C, T, H, W]), "
            f"got {image.dtype} with shape {tuple(image.shape)}"
        )
