"""Image features of a named model (CLIP or DINOv2) from a local folder or hub id, for Fréchet distances.

Images are resized (bicubic, antialiased) straight to the image processor's crop size, or its size
without a crop, and normalised with its mean and std, in torch on the model's device.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor
from torch.nn import functional as F

from flowpost.core.rewards.clip import load_pretrained
from flowpost.core.rewards.model_options import batch_size_option, scoring_device
from flowpost.errors import FlowpostError

FeatureKind = Literal["clip", "dinov2"]


def _input_size(processor: Any) -> tuple[int, int]:
    """(height, width) the model sees: the processor's crop, else its resize target."""
    if getattr(processor, "do_center_crop", False):
        return int(processor.crop_size["height"]), int(processor.crop_size["width"])
    size = processor.size
    if "shortest_edge" in size:
        return int(size["shortest_edge"]), int(size["shortest_edge"])
    return int(size["height"]), int(size["width"])


class ImageFeatures:
    """``kind`` features of ``model``: CLIP's projected image embeddings, or DINOv2's CLS token.

    ``device`` defaults to the device of the images; at most ``batch_size`` images go through at once.
    """

    def __init__(self, model: str, *, kind: FeatureKind, device: str | None = None, batch_size: int = 64) -> None:
        from transformers import AutoImageProcessor, CLIPModel, Dinov2Model

        if not isinstance(model, str) or not model:
            raise FlowpostError(f"model must be a folder or hub id, got {model!r}", where="options.model")
        self.batch_size = batch_size_option(batch_size)
        self.device = scoring_device(device)
        loader = CLIPModel if kind == "clip" else Dinov2Model
        self.kind = kind
        self.model = load_pretrained(loader, model, "model").float().eval().requires_grad_(False)
        processor = load_pretrained(AutoImageProcessor, model, "model")
        self.size = _input_size(processor)
        self.mean = tuple(float(v) for v in processor.image_mean) if processor.do_normalize else (0.0, 0.0, 0.0)
        self.std = tuple(float(v) for v in processor.image_std) if processor.do_normalize else (1.0, 1.0, 1.0)

    def pixel_values(self, images: Tensor) -> Tensor:
        """Model inputs [B, 3, h, w] from images [B, 1 or 3, H, W] in [0, 1]."""
        if images.ndim != 4 or images.shape[1] not in (1, 3):
            raise FlowpostError(f"features need images [B, 1 or 3, H, W], got {tuple(images.shape)}")
        pixels = images.float().clamp(0, 1).expand(-1, 3, -1, -1)
        if tuple(pixels.shape[-2:]) != self.size:
            pixels = F.interpolate(pixels, size=self.size, mode="bicubic", antialias=True).clamp(0, 1)
        mean = torch.tensor(self.mean, device=pixels.device, dtype=pixels.dtype).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=pixels.device, dtype=pixels.dtype).view(1, 3, 1, 1)
        return (pixels - mean) / std

    @torch.no_grad()
    def __call__(self, images: Tensor) -> Tensor:
        """[N, D] float32 features, on the images' device."""
        device = self.device or images.device
        self.model.to(device)
        chunks = []
        for start in range(0, images.shape[0], self.batch_size):
            pixels = self.pixel_values(images[start : start + self.batch_size].to(device))
            if self.kind == "clip":
                pooled = self.model.vision_model(pixel_values=pixels).pooler_output
                chunks.append(self.model.visual_projection(pooled))
            else:
                chunks.append(self.model(pixel_values=pixels).pooler_output)
        return torch.cat(chunks).float().to(images.device)
