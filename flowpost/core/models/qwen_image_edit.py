"""The qwen-image-edit family (Qwen-Image-Edit): a diffusers ``QwenImageEditPipeline`` folder or hub id."""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch, ConditionState
from flowpost.core.models.edit_encoder import SOURCE_AREA, EditPrompts
from flowpost.core.models.edit_state import EditState
from flowpost.core.models.image_text_processor import PROCESSOR, load_image_text_processor
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.qwen_image import QwenImageAdapter
from flowpost.errors import FlowpostError


class QwenImageEditAdapter(QwenImageAdapter):
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

    condition_area: ClassVar[int] = SOURCE_AREA  # the pixels Qwen2.5-VL reads each source at

    @classmethod
    def prompt_encoder(cls, source: PretrainedSource, *, max_length: int) -> EditPrompts:
        """The edit pipeline's encoders for the conditions node (bf16 on a GPU; the VAE always fp32); the node
        sets the number of ``sources`` its edit prompts name."""
        encoder = EditPrompts.for_conditions(cls, source, max_length=max_length)
        assert isinstance(encoder, EditPrompts)
        encoder.condition_area = cls.condition_area
        return encoder

    @cached_property
    def text_encoders(self) -> EditPrompts:
        return EditPrompts(
            type(self), self.source, self.encoder_max_length, sources=self.sources, condition_area=self.condition_area
        )

    def encode_edits(self, instructions: list[str], images: list[Any]) -> ConditionBatch:
        """The conditions of ``instructions`` applied to the PIL ``images``, as the conditions node caches them."""
        return self.text_encoders.encode_edits(instructions, images)

    def pipeline_components(self) -> dict[str, Any]:
        """The processor, for images and text (``image_text_processor.py``)."""
        return {PROCESSOR: load_image_text_processor(self.source)}

    @property
    def sources(self) -> int:
        """The source images of one edit."""
        return 1

    @property
    def condition_tokens(self) -> int:
        """The packed tokens of the square sources at the stock pipeline's 1024 x 1024 pixels."""
        return (math.isqrt(SOURCE_AREA) // (self.vae_scale_factor * 2)) ** 2 * self.sources

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
