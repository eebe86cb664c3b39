"""CLIP-based rewards: ``clip_score`` (text-image agreement) and ``pickscore`` (a preference model).

Both load a transformers ``CLIPModel``, its tokenizer and image processor from a local folder or a
hub id. Images are turned into CLIP inputs in torch, following the image processor's settings
(resize, centre crop, normalisation), so batches stay on the scoring device.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from flowpost.core.rewards.model_options import scoring_options
from flowpost.errors import FlowpostError

RESAMPLING = {0: "nearest-exact", 2: "bilinear", 3: "bicubic"}  # PIL filter codes used by image processors
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
CLIP_SCORE_SCALE = 100.0


def load_pretrained(loader: Any, source: str, option: str) -> Any:
    """``loader.from_pretrained(source)`` where ``source`` is a local folder or a hub id."""
    folder = Path(source).expanduser()
    if folder.is_dir():
        source = str(folder)
    elif folder.exists() or not HUB_ID.fullmatch(source):
        raise FlowpostError(
            f"no model folder at {source!r}; give a folder holding config.json and weights, or a hub id "
            "such as 'openai/clip-vit-base-patch32'",
            where=f"options.{option}",
        )
    try:
        return loader.from_pretrained(source)
    except (OSError, ValueError) as exc:
        detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise FlowpostError(
            f"cannot load {loader.__name__} from {source!r} ({detail}); a hub id needs network access or a "
            "copy in the Hugging Face cache, and gated repositories need HF_TOKEN in the environment",
            where=f"options.{option}",
        ) from None


class ClipSimilarity:
    """Cosine similarity between CLIP image and text embeddings, batched and without gradients.

    ``model`` is a local folder or hub id of a CLIP model; ``processor`` (default: ``model``) holds
    the tokenizer and image processor. ``device`` defaults to the device of the scored media;
    ``dtype`` is one of float32, float16, bfloat16; at most ``batch_size`` samples go through the
    model at once.
    """

    name = "clip_similarity"

    def __init__(
        self,
        model: str,
        *,
        processor: str | None = None,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        from transformers import AutoImageProcessor, CLIPModel, CLIPTokenizer

        self.device, self.dtype, self.batch_size = scoring_options(device, dtype, batch_size)
        if not isinstance(model, str | Path):
            raise FlowpostError(f"model must be a folder or hub id, got {model!r}", where="options.model")
        processor_option = "model" if processor is None else "processor"
        processor_source = str(model if processor is None else processor)
        self.model = load_pretrained(CLIPModel, str(model), "model").to(dtype=self.dtype).eval().requires_grad_(False)
        self.tokenizer = load_pretrained(CLIPTokenizer, processor_source, processor_option)
        self.image_processor = load_pretrained(AutoImageProcessor, processor_source, processor_option)
        resample = int(getattr(self.image_processor, "resample", 3))
        if resample not in RESAMPLING:
            raise FlowpostError(
                f"image processor resampling {resample} is not supported; supported PIL codes: "
                f"{', '.join(map(str, RESAMPLING))}",
                where=f"options.{processor_option}",
            )
        self.resample = RESAMPLING[resample]
        self.max_length = min(
            int(self.tokenizer.model_max_length), int(self.model.config.text_config.max_position_embeddings)
        )

    def pixel_values(self, media: Tensor) -> Tensor:
        """CLIP image inputs [B, 3, h, w] from ``media`` [B, 1 or 3, H, W] in [0, 1]."""
        if media.ndim != 4 or media.shape[1] not in (1, 3):
            raise FlowpostError(
                f"{self.name} needs grayscale or RGB media [B, 1 or 3, H, W], got {tuple(media.shape)}",
                where="rewards",
            )
        processor = self.image_processor
        images = media.detach().float().clamp(0, 1).expand(-1, 3, -1, -1)
        if processor.do_resize:
            height, width = images.shape[-2:]
            shortest = processor.size.get("shortest_edge")
            if shortest:
                short, long = sorted((height, width))
                scaled = (shortest, int(shortest * long / short))
                size = scaled if height <= width else scaled[::-1]
            else:
                size = (processor.size["height"], processor.size["width"])
            antialias = self.resample != "nearest-exact"
            images = F.interpolate(images, size=size, mode=self.resample, antialias=antialias).clamp(0, 1)
        if processor.do_center_crop:
            height, width = images.shape[-2:]
            crop_height, crop_width = processor.crop_size["height"], processor.crop_size["width"]
            if crop_height > height or crop_width > width:
                raise FlowpostError(
                    f"image processor crops {crop_height}x{crop_width} from a {height}x{width} image",
                    where="rewards",
                )
            top, left = (height - crop_height) // 2, (width - crop_width) // 2
            images = images[..., top : top + crop_height, left : left + crop_width]
        if processor.do_normalize:
            mean = torch.tensor(processor.image_mean, device=images.device).view(1, 3, 1, 1)
            std = torch.tensor(processor.image_std, device=images.device).view(1, 3, 1, 1)
            images = (images - mean) / std
        return images

    def text_inputs(self, prompts: list[str]) -> dict[str, Tensor]:
        """Token ids and attention mask, padded to the longest prompt and truncated to the text model's length."""
        return dict(
            self.tokenizer(
                list(prompts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            )
        )

    @torch.no_grad()
    def cosine(self, media: Tensor, prompts: list[str]) -> Tensor:
        """[B] float32 cosine similarity of each image with its prompt, on ``media``'s device."""
        if len(prompts) != media.shape[0]:
            raise FlowpostError(f"{self.name} got {media.shape[0]} images and {len(prompts)} prompts", where="rewards")
        device = self.device or media.device
        self.model.to(device)
        scores = []
        for start in range(0, media.shape[0], self.batch_size):
            stop = start + self.batch_size
            pixels = self.pixel_values(media[start:stop].to(device)).to(self.dtype)
            text = {key: value.to(device) for key, value in self.text_inputs(prompts[start:stop]).items()}
            image_embeds = self.model.visual_projection(self.model.vision_model(pixel_values=pixels).pooler_output)
            text_embeds = self.model.text_projection(self.model.text_model(**text).pooler_output)
            scores.append(F.cosine_similarity(image_embeds.float(), text_embeds.float(), dim=-1))
        if not scores:
            return torch.zeros(0, dtype=torch.float32, device=media.device)
        return torch.cat(scores).to(media.device)


class ClipScore(ClipSimilarity):
    """CLIP score: ``100 * max(cos(image, prompt), 0)``, the convention of the usual CLIP-score metric."""

    name = "clip_score"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        return CLIP_SCORE_SCALE * self.cosine(media, prompts).clamp_min(0)


class PickScore(ClipSimilarity):
    """PickScore: ``exp(logit_scale) * cos(image, prompt)`` under a PickScore CLIP checkpoint."""

    name = "pickscore"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        scale = float(self.model.logit_scale.float().exp())
        return scale * self.cosine(media, prompts)
