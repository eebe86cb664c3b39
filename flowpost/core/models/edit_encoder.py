"""An edit family's conditions: each instruction (read with its source images where the family's text encoder
sees images) and each source's packed VAE latents, computed as the family's stock edit pipeline computes them and
cached together in one row."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.edit_prompts import parse_edit_sources, source_file
from flowpost.core.models.pipeline_prompts import PipelinePrompts, PromptFamily
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.errors import FlowpostError


class EditFamily(PromptFamily, Protocol):
    """What ``EditPrompts`` reads of an edit family class besides its text encoders."""

    family: ClassVar[str]
    vae_class: ClassVar[str]  # the diffusers class of the ``vae`` component

    @classmethod
    def edit_components(cls, source: PretrainedSource) -> dict[str, Any]:
        """Pipeline components the encoding reads besides the text encoders and the VAE (e.g. a processor)."""
        ...

    @classmethod
    def edit_conditions(
        cls,
        pipeline: Any,
        instructions: list[str],
        images: list[list[Any]],
        *,
        device: torch.device,
        max_length: int,
        sources: bool,
    ) -> ConditionBatch:
        """The conditions of ``instructions``, each applied to its square PIL source images ``images[i]`` in order
        (``sources=False``: zero source latents, for a prompt without a source)."""
        ...


def packed_sources(pipeline: Any, pixels: Tensor, *, encode: bool = True) -> Tensor:
    """The stock pipeline's source latents of preprocessed ``pixels``: the VAE posterior's mode normalised as the
    pipeline normalises it, packed 2x2 and flattened per row (fp32); zeros of that size without ``encode``."""
    if not encode:
        cells = (pixels.shape[-2] // pipeline.vae_scale_factor // 2) * (
            pixels.shape[-1] // pipeline.vae_scale_factor // 2
        )
        return torch.zeros(len(pixels), cells * pipeline.latent_channels * 4)
    device = next(pipeline.vae.parameters()).device
    latents = pipeline._encode_vae_image(pixels.to(device, torch.float32), generator=None)
    batch, channels, *_, rows, columns = latents.shape
    return pipeline._pack_latents(latents, batch, channels, rows, columns).reshape(batch, -1).float()


@dataclass
class EditPrompts(PipelinePrompts):
    """The edit pipeline's text encoders, extra components and VAE (fp32), loaded on first use.

    ``encode`` takes edit prompts (``instruction [source DIGEST] ...``) naming ``sources`` source images each,
    which lie in one of ``source_dirs`` (a dataset's ``assets/``); a plain prompt (the null prompt) is read with
    as many black squares and has zero source latents (the latents' mean: no source).
    """

    family: type[EditFamily]  # type: ignore[assignment]
    source_dirs: tuple[Path, ...] = ()
    sources: int = 1

    def components(self) -> dict[str, Any]:
        import diffusers

        vae_source = dataclasses.replace(self.source, torch_dtype="float32")
        vae = vae_source.load("vae", getattr(diffusers, self.family.vae_class))
        return {**super().components(), "vae": vae, **self.family.edit_components(self.source)}

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
        return padded_cat(parts).index(order)

    @torch.no_grad()
    def encode_edits(
        self, instructions: list[str], images: list[Any], *, source_latents: bool = True
    ) -> ConditionBatch:
        """As the family's stock pipeline prepares an edit (``edit_conditions``) of each square source
        (``images[i]``: a PIL image, or a list of them); fp32 on the CPU, the mask int8."""
        rows = [list(image) if isinstance(image, (list, tuple)) else [image] for image in images]
        if any(image.width != image.height for row in rows for image in row):
            raise FlowpostError(
                "edit source images are square here (the dataset's preprocessing crops them); got "
                f"{next(image.size for row in rows for image in row if image.width != image.height)}",
                where="conditions",
            )
        batch = self.family.edit_conditions(
            self.pipeline,
            instructions,
            rows,
            device=torch.device(self.device),
            max_length=self.max_length,
            sources=source_latents,
        )
        return ConditionBatch(
            batch.token_states.float().cpu(), batch.token_mask.to("cpu", torch.int8), batch.pooled.float().cpu()
        )


def padded_cat(parts: list[ConditionBatch]) -> ConditionBatch:
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
