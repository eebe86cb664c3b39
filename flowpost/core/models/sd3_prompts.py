"""The sd3 family's text encoders (CLIP-L, CLIP-G, T5) run through the stock pipeline's ``encode_prompt``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from flowpost.core.conditions import ConditionBatch
from flowpost.core.io import sha256_json
from flowpost.core.models.pretrained import PretrainedSource

T5_MAX_LENGTH = 256  # the stock pipeline's max_sequence_length


@dataclass
class SD3PromptEncoder:
    """The three text encoders and tokenizers of ``source`` (no transformer, no VAE), loaded on first use.

    ``for_conditions`` runs them in bf16 on a GPU when one is present; ``release`` frees them.
    """

    source: PretrainedSource
    max_length: int = T5_MAX_LENGTH
    device: str = "cpu"

    @classmethod
    def for_conditions(cls, source: PretrainedSource, *, max_length: int) -> SD3PromptEncoder:
        """On a GPU: bf16 weights there; otherwise the source's dtype on the CPU."""
        if torch.cuda.is_available():
            return cls(dataclasses.replace(source, torch_dtype="bfloat16"), max_length, "cuda")
        return cls(source, max_length)

    @cached_property
    def pipeline(self) -> Any:
        from diffusers import StableDiffusion3Pipeline
        from transformers import CLIPTextModelWithProjection, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

        load = self.source.load
        pipeline = StableDiffusion3Pipeline(
            transformer=None,
            scheduler=None,
            vae=None,
            text_encoder=load("text_encoder", CLIPTextModelWithProjection),
            tokenizer=load("tokenizer", CLIPTokenizer, weights=False),
            text_encoder_2=load("text_encoder_2", CLIPTextModelWithProjection),
            tokenizer_2=load("tokenizer_2", CLIPTokenizer, weights=False),
            text_encoder_3=load("text_encoder_3", T5EncoderModel),
            tokenizer_3=load("tokenizer_3", T5TokenizerFast, weights=False),
        )
        return pipeline.to(self.device)

    @cached_property
    def fingerprint(self) -> str:
        """The pipeline folder's identity (``PretrainedSource.fingerprint``), the dtype and the T5 length."""
        weights = self.source.fingerprint()
        return sha256_json(
            {"encoder": "sd3", "weights": weights, "dtype": self.source.torch_dtype, "max_length": self.max_length}
        )[:16]

    @torch.no_grad()
    def encode(self, prompts: list[str], *, max_length: int | None = None) -> ConditionBatch:
        """The pipeline's own ``encode_prompt``: [CLIP-L | CLIP-G] padded to the T5 width, then T5 tokens;
        pooled CLIP-L + CLIP-G; fp32 on the CPU. The mask is all ones: SD3 attends to every position."""
        embeds, _, pooled, _ = self.pipeline.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=torch.device(self.device),
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_length if max_length is None else max_length,
        )
        mask = torch.ones(embeds.shape[:2], dtype=torch.int8)
        return ConditionBatch(embeds.float().cpu(), mask, pooled.float().cpu())

    def release(self) -> None:
        """Drop the text encoders (and the GPU memory they held)."""
        self.__dict__.pop("pipeline", None)
        if self.device == "cuda":
            torch.cuda.empty_cache()
