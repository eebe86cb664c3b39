"""An edit family's conditions: each instruction read by Qwen2.5-VL with its source images, and each source's
packed VAE latents, computed as the stock edit pipelines compute them and cached together in one row."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from flowpost.core.conditions import ConditionBatch
from flowpost.core.edit_prompts import parse_edit_sources, source_file
from flowpost.core.models.image_text_processor import load_image_text_processor
from flowpost.core.models.pipeline_prompts import PipelinePrompts
from flowpost.errors import FlowpostError

SOURCE_AREA = 1024 * 1024  # the stock edit pipelines VAE-encode each source at this many pixels, at its aspect ratio


@dataclass
class EditPrompts(PipelinePrompts):
    """The edit pipeline's text encoder, processor and VAE (fp32), loaded on first use.

    ``encode`` takes edit prompts (``instruction [source DIGEST] ...``) naming ``sources`` source images each,
    which lie in one of ``source_dirs`` (a dataset's ``assets/``); a plain prompt (the null prompt) is read with
    as many black squares and has zero source latents (the latents' mean: no source). Qwen2.5-VL reads each
    source at ``condition_area`` pixels (Qwen-Image-Edit: ``SOURCE_AREA``; Edit-Plus: 384 x 384).
    """

    source_dirs: tuple[Path, ...] = ()
    sources: int = 1
    condition_area: int = SOURCE_AREA

    @cached_property
    def pipeline(self) -> Any:
        import diffusers
        import transformers

        self.source.check_components()
        (encoder, tokenizer), *_ = self.family.text_models
        vae_source = dataclasses.replace(self.source, torch_dtype="float32")
        pipeline = getattr(diffusers, self.family.pipeline_class)(
            transformer=None,
            scheduler=None,
            vae=vae_source.load("vae", diffusers.AutoencoderKLQwenImage),
            text_encoder=self.source.load("text_encoder", getattr(transformers, encoder)),
            tokenizer=self.source.load("tokenizer", getattr(transformers, tokenizer), weights=False),
            processor=load_image_text_processor(self.source),
        )
        return pipeline.to(self.device)

    def source_image(self, digest: str, *, prompt: str) -> Any:
        """The RGB source image of ``digest`` from the first of ``source_dirs`` holding it."""
        from PIL import Image

        for directory in self.source_dirs:
            if (path := source_file(directory, digest)).is_file():
                with Image.open(path) as image:
                    return image.convert("RGB")
        raise FlowpostError(
            f"edit prompt {prompt!r} names source image {digest}, which no dataset of this condition cache holds "
            "(sources/<digest>.png); re-run the acquisition of its dataset",
            where="conditions",
        )

    @torch.no_grad()
    def encode(self, prompts: list[str], *, max_length: int | None = None) -> ConditionBatch:
        """Each prompt's instruction read with its source images, and their latents (fp32 on the CPU)."""
        from PIL import Image

        parsed = [parse_edit_sources(prompt) for prompt in prompts]
        edits = [i for i, edit in enumerate(parsed) if edit is not None]
        plain = [i for i, edit in enumerate(parsed) if edit is None]
        parts = []
        if edits:
            images = [self.source_images(parsed[i][1], prompt=prompts[i]) for i in edits]  # type: ignore[index]
            parts.append(self.encode_edits([parsed[i][0] for i in edits], images))  # type: ignore[index]
        if plain:
            black = [[Image.new("RGB", (64, 64))] * self.sources] * len(plain)
            parts.append(self.encode_edits([prompts[i] for i in plain], black, source_latents=False))
        order = torch.argsort(torch.tensor(edits + plain))
        return _padded_cat(parts).index(order)

    def source_images(self, digests: tuple[str, ...], *, prompt: str) -> list[Any]:
        """The RGB source images of an edit prompt, refused unless it names ``sources`` of them."""
        if len(digests) != self.sources:
            raise FlowpostError(
                f"edit prompt {prompt!r} names {len(digests)} source image(s); {self.family.family} reads "
                f"{self.sources} here",
                where="conditions",
            )
        return [self.source_image(digest, prompt=prompt) for digest in digests]

    @torch.no_grad()
    def encode_edits(
        self, instructions: list[str], images: list[Any], *, source_latents: bool = True
    ) -> ConditionBatch:
        """As the stock pipeline's ``__call__`` prepares an edit: each square source (``images[i]``: a PIL image,
        or a list of them) resized to ``condition_area`` and read with its instruction by ``encode_prompt``, and
        resized to ``SOURCE_AREA`` and VAE-encoded (the posterior's mode, normalised by the VAE's statistics)
        then packed 2x2; each row's packed latents, source after source, flattened into ``pooled`` (zeros
        without ``source_latents``)."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

        pipeline, device = self.pipeline, torch.device(self.device)
        rows = [list(image) if isinstance(image, (list, tuple)) else [image] for image in images]
        if any(image.width != image.height for row in rows for image in row):
            raise FlowpostError(
                "edit source images are square here (the dataset's preprocessing crops them); got "
                f"{next(image.size for row in rows for image in row if image.width != image.height)}",
                where="conditions",
            )
        side, _, _ = calculate_dimensions(SOURCE_AREA, 1.0)
        read, _, _ = calculate_dimensions(self.condition_area, 1.0)
        parts = []
        for instruction, row in zip(instructions, rows, strict=True):  # one edit at a time: the stock batch
            condition = [pipeline.image_processor.resize(image, read, read) for image in row]
            embeds, mask = pipeline.encode_prompt(
                prompt=[instruction], image=condition, device=device, max_sequence_length=self.max_length
            )
            if mask is None:  # the pipeline drops a mask without padding
                mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
            if source_latents:
                pixels = pipeline.image_processor.preprocess(row, side, side).unsqueeze(2)
                latents = pipeline._encode_vae_image(pixels.to(device, torch.float32), generator=None)
                count, channels, _, height, width = latents.shape
                packed = pipeline._pack_latents(latents, count, channels, height, width).reshape(1, -1)
            else:
                cells = (side // pipeline.vae_scale_factor // 2) ** 2 * len(row)
                packed = torch.zeros(1, cells * pipeline.latent_channels * 4)
            parts.append(ConditionBatch(embeds.float().cpu(), mask.to("cpu", torch.int8), packed.float().cpu()))
        return _padded_cat(parts)


def _padded_cat(parts: list[ConditionBatch]) -> ConditionBatch:
    """The batches one after another, token states and masks zero-padded to the longest."""
    length = max(part.token_states.shape[1] for part in parts)
    padded = [
        ConditionBatch(
            torch.nn.functional.pad(part.token_states, (0, 0, 0, length - part.token_states.shape[1])),
            torch.nn.functional.pad(part.token_mask, (0, length - part.token_mask.shape[1])),
            part.pooled,
        )
        for part in parts
    ]
    return ConditionBatch.cat(padded)
