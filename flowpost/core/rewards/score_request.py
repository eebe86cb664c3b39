"""The ``POST /score`` body model and its decoding; what the client got wrong is a ``BadRequest``."""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, ConfigDict
from torch import Tensor


class BadRequest(Exception):
    """A request the server refuses: HTTP ``status`` (400, or 413 for one too large) and why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ScoreRequest:
    """One batch to score: ``media`` [B, C, H, W] in [0, 1], a prompt and metadata dict per sample."""

    media: Tensor
    prompts: list[str]
    metadata: list[dict[str, Any]]


def decode_images(images: list[str], *, max_batch: int) -> Tensor:
    """[B, C, H, W] float32 in [0, 1] from base64 images of one size (C = 1 for grayscale, else 3)."""
    if not images:
        raise BadRequest('"images" must be a non-empty list of base64 strings')
    if len(images) > max_batch:
        raise BadRequest(
            f"a batch of {len(images)} images is over this server's limit of {max_batch}; send smaller batches "
            "or start the server with a larger --max-batch",
            status=413,
        )
    arrays = []
    for i, encoded in enumerate(images):
        try:
            with Image.open(io.BytesIO(base64.b64decode(encoded, validate=True))) as image:
                image.load()
                array = np.asarray(image if image.mode == "L" else image.convert("RGB"))
        except (TypeError, binascii.Error, UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
            raise BadRequest(f"images[{i}] is not a base64-encoded image ({exc})") from None
        arrays.append(array[..., None] if array.ndim == 2 else array)
    if any(array.shape != arrays[0].shape for array in arrays):
        shapes = sorted({array.shape for array in arrays})
        raise BadRequest(f"all images must have the same size and mode, got (H, W, C) shapes {shapes}")
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255


class ScoreBody(BaseModel):
    """The JSON body of ``POST /score``: one prompt, metadata object and base64 image per sample."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompts: list[str]
    images: list[str]
    metadata: list[dict[str, Any]] | None = None


def parse_score_request(body: ScoreBody, *, max_batch: int) -> ScoreRequest:
    """The batch in a validated body: images decoded, one prompt and metadata object per image."""
    media = decode_images(body.images, max_batch=max_batch)
    batch = media.shape[0]
    if len(body.prompts) != batch:
        raise BadRequest(f'"prompts" must be a list of {batch} strings, one per image')
    metadata = body.metadata if body.metadata is not None else [{} for _ in range(batch)]
    if len(metadata) != batch:
        raise BadRequest(f'"metadata" must be a list of {batch} objects, one per image')
    return ScoreRequest(media, body.prompts, metadata)
