"""ImageReward ``imagereward`` (Xu et al. 2023): a BLIP reward model trained on human rankings of generations.

As in the reference (``ImageReward/ImageReward.py``): the prompt is tokenised with BERT's uncased
tokenizer, padded to 35 tokens; the image is resized (bicubic) and centre-cropped to 224 and normalised with
CLIP's mean and std; the score is ``(mlp(text_encoder(prompt, image)[CLS]) - 0.16717362830052426) /
1.0333394966054072``, the raw reward standardised with the published mean and std (about -2 to 2).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from flowpost.core.rewards.clip import load_pretrained
from flowpost.core.rewards.imagereward_model import ImageRewardModel, blip_configs, imagereward_state_dict
from flowpost.core.rewards.model_options import read_checkpoint, scoring_options
from flowpost.core.rewards.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, square_inputs
from flowpost.errors import FlowpostError

REWARD_MEAN = 0.16717362830052426
REWARD_STD = 1.0333394966054072
PROMPT_TOKENS = 35
TOKENIZER = "bert-base-uncased"


def _load_model(state: dict[str, Tensor], checkpoint: str, pad_token_id: int) -> ImageRewardModel:
    """The network of the released ``state`` (``ImageReward.pt`` names), every tensor checked."""
    try:
        converted = imagereward_state_dict(state)
        vision, text = blip_configs(converted, pad_token_id=pad_token_id)
    except KeyError as exc:
        raise FlowpostError(
            f"{checkpoint!r} is not an ImageReward state dict: tensor {exc.args[0]!r} unexpected or missing",
            where="options.checkpoint",
        ) from None
    except ValueError as exc:
        raise FlowpostError(
            f"{checkpoint!r} is not an ImageReward state dict: {exc}", where="options.checkpoint"
        ) from None
    model = ImageRewardModel(vision, text)
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    found = {key: tuple(value.shape) for key, value in converted.items()}
    if found != expected:
        wrong = sorted(key for key in expected.keys() | found.keys() if expected.get(key) != found.get(key))
        raise FlowpostError(
            f"{checkpoint!r} is not a complete ImageReward state dict: {len(wrong)} tensors missing or of "
            f"another shape, e.g. {wrong[:3]}",
            where="options.checkpoint",
        )
    model.load_state_dict(converted)
    if text.max_position_embeddings < PROMPT_TOKENS:
        raise FlowpostError(
            f"{checkpoint!r} reads at most {text.max_position_embeddings} tokens; ImageReward pads prompts to "
            f"{PROMPT_TOKENS}",
            where="options.checkpoint",
        )
    return model


class ImageReward:
    """ImageReward: each image's standardised reward for its prompt.

    ``checkpoint`` is the local released ``ImageReward.pt`` (its state dict: BLIP ViT-L/16, BERT-base with
    cross-attention and the MLP; the architecture is read from its tensors); ``tokenizer`` a folder or hub id
    of BERT's uncased tokenizer. ``device`` defaults to the device of the scored media; ``dtype`` (one of
    float32, float16, bfloat16) is that of BLIP, the MLP runs in float32; at most ``batch_size`` samples go
    through the model at once.
    """

    name = "imagereward"

    def __init__(
        self,
        checkpoint: str,
        *,
        tokenizer: str = TOKENIZER,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        from transformers import BertTokenizer

        self.device, self.dtype, self.batch_size = scoring_options(device, dtype, batch_size)
        state = read_checkpoint(checkpoint, what="the ImageReward checkpoint (ImageReward.pt)")
        self.tokenizer = load_pretrained(BertTokenizer, str(tokenizer), "tokenizer")
        self.model = _load_model(state, str(checkpoint), int(self.tokenizer.pad_token_id))
        self.model.to(dtype=self.dtype).eval().requires_grad_(False)
        self.model.mlp.float()
        self.image_size = int(self.model.vision_model.config.image_size)

    def text_inputs(self, prompts: list[str]) -> dict[str, Tensor]:
        """Token ids and attention mask, padded (and truncated) to 35 tokens as in the reference."""
        tokens = self.tokenizer(
            list(prompts), padding="max_length", truncation=True, max_length=PROMPT_TOKENS, return_tensors="pt"
        )
        return {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}

    @torch.no_grad()
    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        if len(prompts) != media.shape[0]:
            raise FlowpostError(f"{self.name} got {media.shape[0]} images and {len(prompts)} prompts", where="rewards")
        device = self.device or media.device
        self.model.to(device)
        scores = [torch.zeros(0, dtype=torch.float32, device=media.device)]
        for start in range(0, media.shape[0], self.batch_size):
            stop = start + self.batch_size
            pixels = square_inputs(
                media[start:stop].to(device),
                self.image_size,
                mean=OPENAI_CLIP_MEAN,
                std=OPENAI_CLIP_STD,
                reward=self.name,
            )
            text = {key: value.to(device) for key, value in self.text_inputs(prompts[start:stop]).items()}
            raw = self.model(pixels.to(self.dtype), **text)
            scores.append(((raw - REWARD_MEAN) / REWARD_STD).to(media.device))
        return torch.cat(scores)
