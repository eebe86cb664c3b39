"""A tiny random LLaVA (a one-layer CLIP vision tower, a two-layer Qwen2 language model, a tokenizer trained here)
saved with its processor and chat template as a folder ``transformers serve`` and ``AutoModelForImageTextToText``
load.

Its output layer answers only in yes/no words and digits: each yes row is the negative of its no row (so one
of the two always has a positive logit and ranks among the most likely first tokens), the digit rows are random,
every other row is zero. Which answer wins still depends on the image and the question.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or part['type'] == 'image_url' %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    'Does this image match the description "a photo of a red cat"? Answer yes or no.',
    "Rate from 0 to 10 how well this image matches. Answer with the number only.",
    "Both images were generated for the description. Does the first image match it better than the second?",
    "Yes",
    "No",
    "yes",
    "no",
]
PAIRS = [("Yes", "No"), ("yes", "no")]
IMAGE_SIZE = 28  # pixels: 2x2 patches of 14


def tiny_vlm_tokenizer():  # noqa: ANN201
    """A byte-level BPE trained on ``CORPUS`` with Qwen2's pre-tokenization, as a ``Qwen2Tokenizer``."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(CORPUS, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=merges)
    tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    return tokenizer


def build_tiny_vlm(folder: Path, *, seed: int = 0) -> Path:
    """Assemble the random LLaVA (under 1 MB) with its processor and save them to ``folder``."""
    from transformers import (
        CLIPImageProcessor,
        GenerationConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = tiny_vlm_tokenizer()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        patch_size=14,
        vision_feature_select_strategy="default",
        image_token="<image>",
        num_additional_image_tokens=1,  # CLIP's class token, which the default strategy drops
    )
    config = LlavaConfig(
        text_config={
            "model_type": "qwen2",
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            "bos_token_id": None,
            "eos_token_id": end,
            "tie_word_embeddings": False,
            "initializer_range": 0.5,  # weights wide enough that the image and the question move the answer
        },
        vision_config={
            "model_type": "clip_vision_model",
            "image_size": IMAGE_SIZE,
            "patch_size": 14,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "projection_dim": 16,
            "initializer_range": 0.5,
            "initializer_factor": 25.0,
        },
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
        head = torch.zeros_like(model.lm_head.weight)
        for yes, no in PAIRS:
            row = torch.randn(head.shape[1]) * 0.3
            head[tokenizer.convert_tokens_to_ids(yes)], head[tokenizer.convert_tokens_to_ids(no)] = row, -row
        for digit in "0123456789":
            head[tokenizer.convert_tokens_to_ids(digit)] = torch.randn(head.shape[1]) * 0.3
    with torch.no_grad():
        model.lm_head.weight.copy_(head)
    model.generation_config = GenerationConfig(do_sample=False, eos_token_id=end, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
