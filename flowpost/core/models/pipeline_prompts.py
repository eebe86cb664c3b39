"""A pipeline family's own text encoders, run through its stock pipeline's ``encode_prompt``: what the
adapter's ``encode_conditions`` and the conditions node both call."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.io import sha256_json
from flowpost.core.models.pretrained import PretrainedSource


class PromptFamily(Protocol):
    """What ``PipelinePrompts`` reads of a family class (``PipelineFamily`` provides it)."""

    encoder_name: ClassVar[str]
    pipeline_class: ClassVar[str]  # the diffusers pipeline whose ``encode_prompt`` runs the encoders
    # the transformers classes of (text_encoder, tokenizer), (text_encoder_2, tokenizer_2), ...
    text_models: ClassVar[tuple[tuple[str, str], ...]]

    @staticmethod
    def prompt_embeddings(
        pipeline: Any, prompts: list[str], *, device: torch.device, max_length: int
    ) -> ConditionBatch:
        """Token states, their mask and pooled vectors from ``pipeline.encode_prompt``."""
        ...


def unmasked(token_states: Tensor, pooled: Tensor) -> ConditionBatch:
    """Token states every position of which the transformer attends to (the MMDiT families: padding included)."""
    mask = torch.ones(token_states.shape[:2], dtype=torch.int8, device=token_states.device)
    return ConditionBatch(token_states, mask, pooled)


@dataclass
class PipelinePrompts:
    """The text encoders and tokenizers of ``source`` (no transformer, no VAE), loaded on first use.

    ``for_conditions`` runs them in bf16 on a GPU when one is present; ``release`` frees them.
    """

    family: type[PromptFamily]
    source: PretrainedSource
    max_length: int
    device: str = "cpu"

    @classmethod
    def for_conditions(
        cls, family: type[PromptFamily], source: PretrainedSource, *, max_length: int
    ) -> PipelinePrompts:
        """On a GPU: bf16 weights there; otherwise the source's dtype on the CPU."""
        if torch.cuda.is_available():
            return cls(family, dataclasses.replace(source, torch_dtype="bfloat16"), max_length, "cuda")
        return cls(family, source, max_length)

    @cached_property
    def pipeline(self) -> Any:
        import diffusers

        self.source.check_components()
        pipeline = getattr(diffusers, self.family.pipeline_class)(transformer=None, scheduler=None, **self.components())
        return pipeline.to(self.device)

    def components(self) -> dict[str, Any]:
        """The pipeline components the encoding reads: the text encoders and tokenizers (no VAE)."""
        import transformers

        parts: dict[str, Any] = {"vae": None}
        for index, (encoder, tokenizer) in enumerate(self.family.text_models):
            suffix = f"_{index + 1}" if index else ""
            parts[f"text_encoder{suffix}"] = self.source.load(f"text_encoder{suffix}", getattr(transformers, encoder))
            parts[f"tokenizer{suffix}"] = self.source.load(
                f"tokenizer{suffix}", getattr(transformers, tokenizer), weights=False
            )
        return parts

    @cached_property
    def fingerprint(self) -> str:
        """The pipeline folder's identity (``PretrainedSource.fingerprint``), the dtype and the token length."""
        weights = self.source.fingerprint()
        return sha256_json(
            {
                "encoder": self.family.encoder_name,
                "weights": weights,
                "dtype": self.source.torch_dtype,
                "max_length": self.max_length,
            }
        )[:16]

    @torch.no_grad()
    def encode(self, prompts: list[str], *, max_length: int | None = None) -> ConditionBatch:
        """The pipeline's own ``encode_prompt``, fp32 on the CPU (the mask int8)."""
        batch = self.family.prompt_embeddings(
            self.pipeline,
            prompts,
            device=torch.device(self.device),
            max_length=self.max_length if max_length is None else max_length,
        )
        return ConditionBatch(
            batch.token_states.float().cpu(), batch.token_mask.to("cpu", torch.int8), batch.pooled.float().cpu()
        )

    def release(self) -> None:
        """Drop the text encoders (and the GPU memory they held)."""
        self.__dict__.pop("pipeline", None)
        if self.device == "cuda":
            torch.cuda.empty_cache()
