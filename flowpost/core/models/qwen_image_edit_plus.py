"""The qwen-image-edit-plus family (Qwen-Image-Edit-2509): a diffusers ``QwenImageEditPlusPipeline`` folder or hub
id, reading several source images per edit."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.qwen_image_edit import QwenImageEditAdapter
from flowpost.errors import FlowpostError

CONDITION_AREA = 384 * 384  # Qwen2.5-VL reads each source at this many pixels (the VAE at 1024 x 1024)


class QwenImageEditPlusAdapter(QwenImageEditAdapter):
    """Qwen-Image-Edit's transformer, VAE and conditioning with ``sources`` source images per edit
    (``pipeline_qwenimage_edit_plus.py``): the instruction follows one ``Picture N:`` vision block per source in
    the prompt template, each source read by Qwen2.5-VL at 384 x 384 pixels, and every source's packed latents
    (VAE-encoded at 1024 x 1024) follow the noisy latents along the token sequence, each with its own patch grid.

    A condition row is one edit (``instruction [source D1] [source D2] ...``, ``core/edit_prompts.py``); the
    conditions node reads as many sources as its edit prompts name, and ``sources`` must equal that number.
    """

    family: ClassVar[str] = "qwen-image-edit-plus"
    encoder_name = "qwen-image-edit-plus"
    pipeline_class: ClassVar[str] = "QwenImageEditPlusPipeline"
    condition_area: ClassVar[int] = CONDITION_AREA
    options: ClassVar[tuple[str, ...]] = (*QwenImageEditAdapter.options, "sources")

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler: Any,
        source: PretrainedSource,
        *,
        sources: int = 1,
        **options: Any,
    ) -> None:
        super().__init__(transformer, scheduler, source, **options)
        if isinstance(sources, bool) or not isinstance(sources, int) or sources < 1:
            raise FlowpostError(
                f"sources {sources!r} is not a positive number of source images per edit; the stock pipeline "
                "reads 1 to 3",
                where="model.options.sources",
            )
        self._sources = sources

    @property
    def sources(self) -> int:
        """The source images of one edit (``model.options.sources``)."""
        return self._sources
