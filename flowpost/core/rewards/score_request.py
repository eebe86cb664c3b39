"""Parse and validate a ``POST /score`` body; what the client got wrong is a ``BadRequest``."""

from __future__ import annotations

import base64
import binascii
import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
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


def decode_images(images: Any, *, max_batch: int) -> Tensor:
    """[B, C, H, W] float32 in [0, 1] from base64 images of one size (C = 1 for grayscale, else 3)."""
    if not isinstance(images, list) or not images:
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


def parse_score_request(body: bytes, *, max_batch: int) -> ScoreRequest:
    """The batch in a JSON ``{"prompts", "metadata", "images"}`` body, one entry per sample."""
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not JSON ({exc})") from None
    if not isinstance(request, dict):
        raise BadRequest('body must be a JSON object with "prompts", "metadata" and "images"')
    media = decode_images(request.get("images"), max_batch=max_batch)
    batch = media.shape[0]
    prompts = request.get("prompts")
    if not isinstance(prompts, list) or len(prompts) != batch or not all(isinstance(p, str) for p in prompts):
        raise BadRequest(f'"prompts" must be a list of {batch} strings, one per image')
    metadata = request.get("metadata", [{} for _ in range(batch)])
    if not isinstance(metadata, list) or len(metadata) != batch or not all(isinstance(m, dict) for m in metadata):
        raise BadRequest(f'"metadata" must be a list of {batch} objects, one per image')
    return ScoreRequest(media, prompts, metadata)
