"""What an edit family adds to the text-to-image family it extends: conditions that read source images
(``EditPrompts``), the sources' tokens in the memory preflight, and the components its pipeline export loads."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from flowpost.core.conditions import ConditionBatch
from flowpost.core.models.edit_encoder import EditPrompts
from flowpost.core.models.pretrained import PretrainedSource

SOURCE_SIDE = 1024  # the side the stock edit pipelines read a square source at


class EditAdapter:
    """A mixin placed before a ``PipelineFamily``: its conditions node and ``encode_conditions`` read edit prompts
    (``instruction [source DIGEST] ...``) with their ``sources`` source images; the family implements
    ``edit_conditions``."""

    source: PretrainedSource
    encoder_max_length: int
    vae_scale_factor: int

    @classmethod
    def prompt_encoder(cls, source: PretrainedSource, *, max_length: int) -> EditPrompts:
        """The edit pipeline's encoders for the conditions node (bf16 on a GPU; the VAE always fp32); the node
        sets the number of ``sources`` its edit prompts name."""
        encoder = EditPrompts.for_conditions(cls, source, max_length=max_length)  # type: ignore[arg-type]
        assert isinstance(encoder, EditPrompts)
        return encoder

    @cached_property
    def text_encoders(self) -> EditPrompts:
        return EditPrompts(
            type(self),  # type: ignore[arg-type]
            self.source,
            self.encoder_max_length,
            sources=self.sources,
        )

    def encode_edits(self, instructions: list[str], images: list[Any]) -> ConditionBatch:
        """The conditions of ``instructions`` applied to the PIL ``images``, as the conditions node caches them."""
        return self.text_encoders.encode_edits(instructions, images)

    @classmethod
    def edit_components(cls, source: PretrainedSource) -> dict[str, Any]:
        """Pipeline components read besides the text encoders and the VAE (none here)."""
        return {}

    def pipeline_components(self) -> dict[str, Any]:
        """What ``edit_components`` loads, for ``save_pipeline``."""
        return self.edit_components(self.source)

    @classmethod
    def source_side(cls) -> int:
        """The side in pixels the stock pipeline reads a square source at."""
        return SOURCE_SIDE

    @property
    def sources(self) -> int:
        """The source images of one edit."""
        return 1

    @property
    def condition_tokens(self) -> int:
        """The packed tokens of ``sources`` square sources at ``source_side`` pixels."""
        return (self.source_side() // (self.vae_scale_factor * 2)) ** 2 * self.sources
