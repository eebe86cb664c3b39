"""The qwen-image-edit family (Qwen-Image-Edit): a diffusers ``QwenImageEditPipeline`` folder or hub id."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.models.edit_encoder import packed_sources, padded_cat
from flowpost.core.models.edit_family import SOURCE_SIDE, EditAdapter
from flowpost.core.models.edit_state import EditState
from flowpost.core.models.image_text_processor import PROCESSOR, load_image_text_processor
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.qwen_image import QwenImageAdapter
from flowpost.errors import FlowpostError


class QwenImageEditAdapter(EditAdapter, QwenImageAdapter):
    """Qwen-Image's transformer, VAE and scheduler conditioned on an instruction and a source image: the
    instruction is read by Qwen2.5-VL together with the source (the edit template), and the source's packed
    latents follow the noisy latents along the token sequence, with their own patch grid for RoPE; the velocity
    is the output at the noisy tokens (``pipeline_qwenimage_edit.py``).

    A condition row is one edit (``instruction [source DIGEST]``, ``core/edit_prompts.py``): its token
    states, mask and the source's latents (flattened in ``pooled``), cached by the conditions node. It
    samples without true CFG: the stock negative is read with each source image, which the cache's one null
    row is not.
    """

    family: ClassVar[str] = "qwen-image-edit"
    encoder_name = "qwen-image-edit"
    pipeline_class: ClassVar[str] = "QwenImageEditPipeline"
    samples_with_cfg: ClassVar[bool] = False

    condition_area: ClassVar[int] = SOURCE_SIDE**2  # the pixels Qwen2.5-VL reads each source at

    @classmethod
    def edit_components(cls, source: PretrainedSource) -> dict[str, Any]:
        """The processor, for images and text (``image_text_processor.py``)."""
        return {PROCESSOR: load_image_text_processor(source)}

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
        """As the stock pipeline's ``__call__`` prepares an edit, one edit at a time (the stock batch): each square
        source resized to ``condition_area`` and read with the instruction by ``encode_prompt``, and resized to
        ``source_side`` for its packed latents (``packed_sources``), source after source in ``pooled``."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

        side, _, _ = calculate_dimensions(cls.source_side() ** 2, 1.0)
        read, _, _ = calculate_dimensions(cls.condition_area, 1.0)
        parts = []
        for instruction, row in zip(instructions, images, strict=True):
            condition = [pipeline.image_processor.resize(image, read, read) for image in row]
            embeds, mask = pipeline.encode_prompt(
                prompt=[instruction], image=condition, device=device, max_sequence_length=max_length
            )
            if mask is None:  # the pipeline drops a mask without padding
                mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
            pixels = pipeline.image_processor.preprocess(row, side, side).unsqueeze(2)
            packed = packed_sources(pipeline, pixels, encode=sources).reshape(1, -1)
            parts.append(ConditionBatch(embeds.float().cpu(), mask.cpu(), packed.cpu()))
        return padded_cat(parts)

    def prepare_condition_state(self, batch: ConditionBatch) -> EditState:
        return EditState.from_edit_batch(batch, int(self.transformer.config.in_channels), self.sources)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, state: ConditionState) -> Tensor:
        """The transformer on the noisy tokens followed by the sources', at ``timestep = sigma``, with every
        patch grid; the velocity of the noisy tokens, in the latents' dtype."""
        assert isinstance(state, EditState)
        batch, tokens, device, dtype = latents.shape[0], latents.shape[1], latents.device, latents.dtype
        mask = state.mask()
        half, grid = self.latent_size // 2, state.source_grid
        hidden = torch.cat([latents, state.source_latents.to(device=device, dtype=dtype)], dim=1)
        return self.transformer(
            hidden_states=hidden,
            timestep=torch.as_tensor(sigma, dtype=dtype, device=device).expand(batch),
            encoder_hidden_states=state.encoder_hidden_states.to(device=device, dtype=dtype),
            encoder_hidden_states_mask=None if mask is None else mask.to(device),
            img_shapes=[[(1, half, half), *[(1, grid, grid)] * state.sources]] * batch,
            return_dict=False,
        )[0][:, :tokens]

    def forward(
        self,
        latents: Tensor,
        sigma: Tensor,
        state: ConditionState,
        *,
        guidance: float = 1.0,
        negative: ConditionState | None = None,
    ) -> Tensor:
        """The conditional velocity; guidance other than 1 is refused (see the class; ``flowpost validate`` refuses
        it in the pipeline file)."""
        if guidance != 1.0:
            raise FlowpostError(
                f"{self.family} samples without classifier-free guidance here (its negative is read with each "
                f"source image); set guidance to 1, got {guidance}",
                where="sampling.guidance",
            )
        return self.velocity(latents, sigma, state)
