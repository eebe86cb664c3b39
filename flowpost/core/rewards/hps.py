"""Human Preference Score v2 ``hpsv2`` (Wu et al. 2023): how much people would prefer an image for its prompt.

HPS v2 and v2.1 are open_clip ViT-H-14 models fine-tuned on human choices. As in the reference
(``hpsv2/img_score.py``) and DanceGRPO, the score is ``image_features @ text_features.T`` of the
L2-normalised embeddings: the cosine similarity of each image with its prompt (about 0.2-0.4 with the
released weights). The checkpoint is converted to a transformers ``CLIPModel`` when loaded.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from flowpost.core.rewards.clip import load_pretrained
from flowpost.core.rewards.model_options import read_checkpoint, scoring_options
from flowpost.core.rewards.open_clip_checkpoint import clip_config, clip_state_dict, open_clip_architecture
from flowpost.core.rewards.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, square_inputs
from flowpost.errors import FlowpostError

TOKENIZER = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"  # the CLIP BPE vocabulary open_clip tokenizes with


def _load_weights(model: torch.nn.Module, state: dict[str, Tensor], checkpoint: str) -> None:
    """Load ``state`` (open_clip names) into ``model``, refusing any missing, extra or misshapen tensor."""
    try:
        converted = clip_state_dict(state)
    except KeyError as exc:
        raise FlowpostError(
            f"{checkpoint!r} is not an open_clip CLIP state dict: unexpected tensor {exc.args[0]!r}",
            where="options.checkpoint",
        ) from None
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    found = {key: tuple(value.shape) for key, value in converted.items()}
    if found != expected:
        wrong = sorted(key for key in expected.keys() | found.keys() if expected.get(key) != found.get(key))
        raise FlowpostError(
            f"{checkpoint!r} does not fit options.model: {len(wrong)} tensors missing or of another shape, "
            f"e.g. {wrong[:3]} (expected {[expected.get(key) for key in wrong[:3]]}, "
            f"found {[found.get(key) for key in wrong[:3]]})",
            where="options.checkpoint",
        )
    model.load_state_dict(converted)


class HpsV2:
    """HPS v2 / v2.1: the cosine similarity of each image's and its prompt's HPS embeddings, in [-1, 1].

    ``checkpoint`` is the local HPS file (``HPS_v2_compressed.pt`` or ``HPS_v2.1_compressed.pt``: an open_clip
    state dict, itself or under ``state_dict``); ``model`` its open_clip architecture (``ViT-H-14``, or an
    open_clip model config file); ``tokenizer`` a folder or hub id holding the CLIP BPE tokenizer. ``device``
    defaults to the device of the scored media; ``dtype`` is one of float32, float16, bfloat16; at most
    ``batch_size`` samples go through the model at once.
    """

    name = "hpsv2"

    def __init__(
        self,
        checkpoint: str,
        *,
        model: str = "ViT-H-14",
        tokenizer: str = TOKENIZER,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        from transformers import CLIPModel, CLIPTokenizer

        self.device, self.dtype, self.batch_size = scoring_options(device, dtype, batch_size)
        architecture = open_clip_architecture(model)
        state = read_checkpoint(checkpoint, what="the HPS v2 checkpoint (e.g. HPS_v2.1_compressed.pt)")
        self.tokenizer = load_pretrained(CLIPTokenizer, str(tokenizer), "tokenizer")
        special = {f"{name}_token_id": getattr(self.tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad")}
        self.model = CLIPModel(clip_config(architecture, special))
        _load_weights(self.model, state, str(checkpoint))
        self.model.to(dtype=self.dtype).eval().requires_grad_(False)
        self.image_size = architecture.image_size
        self.context_length = architecture.context_length

    def token_ids(self, prompts: list[str]) -> Tensor:
        """[B, L] token ids, each ending in the end-of-text token, at most the model's context length."""
        tokens = self.tokenizer(list(prompts), padding=True, truncation=True, max_length=self.context_length)
        return torch.tensor(tokens["input_ids"], dtype=torch.long)

    @torch.no_grad()
    def embeddings(self, media: Tensor, prompts: list[str]) -> tuple[Tensor, Tensor]:
        """[B, E] image and text embeddings (not normalised) in the model's dtype, on the scoring device.

        The text embedding is taken at the first end-of-text token, as open_clip takes it at the highest
        token id (the end-of-text token has the highest id of the CLIP vocabulary).
        """
        device = self.device or media.device
        self.model.to(device)
        pixels = square_inputs(
            media.to(device), self.image_size, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD, reward=self.name
        )
        ids = self.token_ids(prompts).to(device)
        images = self.model.visual_projection(self.model.vision_model(pixel_values=pixels.to(self.dtype)).pooler_output)
        hidden = self.model.text_model(input_ids=ids).last_hidden_state
        ends = (ids == self.tokenizer.eos_token_id).int().argmax(-1)
        texts = self.model.text_projection(hidden[torch.arange(len(ids), device=device), ends])
        return images, texts

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        if len(prompts) != media.shape[0]:
            raise FlowpostError(f"{self.name} got {media.shape[0]} images and {len(prompts)} prompts", where="rewards")
        scores = [torch.zeros(0, dtype=torch.float32, device=media.device)]
        for start in range(0, media.shape[0], self.batch_size):
            stop = start + self.batch_size
            images, texts = self.embeddings(media[start:stop], prompts[start:stop])
            scores.append(F.cosine_similarity(images.float(), texts.float(), dim=-1).to(media.device))
        return torch.cat(scores)
