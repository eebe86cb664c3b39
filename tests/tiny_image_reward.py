"""A tiny random ImageReward checkpoint under the released file's names, a WordPiece tokenizer trained
locally, and the reference forward pass (BLIP's ViT and BERT as in its ``vit.py``/``med.py``) on the raw
tensors."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor
from torch.nn import functional as F

CORPUS = ["a photo of a red cat", "the digit seven", "a handwritten digit three on paper", "a blue dog in snow"]
VISION_WIDTH, TEXT_WIDTH, HEADS = 128, 128, 2  # heads 64 wide, as in BLIP
IMAGE_SIZE, PATCH, LAYERS, POSITIONS = 32, 8, 2, 40
RAW_MEAN, RAW_STD = 0.16717362830052426, 1.0333394966054072


def write_bert_tokenizer(folder: Path) -> int:
    """An uncased WordPiece vocabulary trained on ``CORPUS`` (``vocab.txt``); returns its size."""
    from tokenizers import BertWordPieceTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(CORPUS, vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    wordpiece.save_model(str(folder))
    return wordpiece.get_vocab_size()


def imagereward_state(vocab_size: int, seed: int = 0) -> dict[str, Tensor]:
    """Random weights under ``ImageReward.pt``'s names, with the tensors the score does not use."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float = 0.1) -> Tensor:
        return torch.randn(*shape, generator=generator) * std

    def linear(name: str, out: int, into: int) -> dict[str, Tensor]:
        return {f"{name}.weight": normal(out, into, std=into**-0.5), f"{name}.bias": normal(out)}

    def norm(name: str, width: int) -> dict[str, Tensor]:
        return {f"{name}.weight": 1 + normal(width), f"{name}.bias": normal(width)}

    vit, bert, grid = "blip.visual_encoder.", "blip.text_encoder.", IMAGE_SIZE // PATCH
    state = {
        f"{vit}cls_token": normal(1, 1, VISION_WIDTH, std=1.0),
        f"{vit}pos_embed": normal(1, grid * grid + 1, VISION_WIDTH, std=0.5),
        f"{vit}patch_embed.proj.weight": normal(VISION_WIDTH, 3, PATCH, PATCH, std=0.05),
        f"{vit}patch_embed.proj.bias": normal(VISION_WIDTH),
        **norm(f"{vit}norm", VISION_WIDTH),
        f"{bert}embeddings.word_embeddings.weight": normal(vocab_size, TEXT_WIDTH, std=1.0),
        f"{bert}embeddings.position_embeddings.weight": normal(POSITIONS, TEXT_WIDTH, std=0.5),
        f"{bert}embeddings.position_ids": torch.arange(POSITIONS)[None],
        **norm(f"{bert}embeddings.LayerNorm", TEXT_WIDTH),
        **linear("blip.vision_proj", 256, VISION_WIDTH),
        **linear("blip.text_proj", 256, TEXT_WIDTH),
    }
    for index in range(LAYERS):
        block = f"{vit}blocks.{index}."
        state |= norm(block + "norm1", VISION_WIDTH) | norm(block + "norm2", VISION_WIDTH)
        state |= linear(block + "attn.qkv", 3 * VISION_WIDTH, VISION_WIDTH)
        state |= linear(block + "attn.proj", VISION_WIDTH, VISION_WIDTH)
        state |= linear(block + "mlp.fc1", 4 * VISION_WIDTH, VISION_WIDTH)
        state |= linear(block + "mlp.fc2", VISION_WIDTH, 4 * VISION_WIDTH)
        layer = f"{bert}encoder.layer.{index}."
        for attention, source in (("attention", TEXT_WIDTH), ("crossattention", VISION_WIDTH)):
            state |= linear(f"{layer}{attention}.self.query", TEXT_WIDTH, TEXT_WIDTH)
            state |= linear(f"{layer}{attention}.self.key", TEXT_WIDTH, source)
            state |= linear(f"{layer}{attention}.self.value", TEXT_WIDTH, source)
            state |= linear(f"{layer}{attention}.output.dense", TEXT_WIDTH, TEXT_WIDTH)
            state |= norm(f"{layer}{attention}.output.LayerNorm", TEXT_WIDTH)
        state |= linear(layer + "intermediate.dense", 4 * TEXT_WIDTH, TEXT_WIDTH)
        state |= linear(layer + "output.dense", TEXT_WIDTH, 4 * TEXT_WIDTH)
        state |= norm(layer + "output.LayerNorm", TEXT_WIDTH)
    widths = [TEXT_WIDTH, 1024, 128, 64, 16, 1]
    for index, (into, out) in zip((0, 2, 4, 6, 7), zip(widths, widths[1:], strict=False), strict=True):
        state |= linear(f"mlp.layers.{index}", out, into)
    return state


def build_tiny_image_reward(folder: Path, seed: int = 0) -> dict[str, Path]:
    """Write ``checkpoint`` (``ImageReward.pt``'s layout) and a ``tokenizer`` folder; returns their paths."""
    vocab_size = write_bert_tokenizer(folder / "tokenizer")
    torch.save(imagereward_state(vocab_size, seed), folder / "ImageReward.pt")
    return {"checkpoint": folder / "ImageReward.pt", "tokenizer": folder / "tokenizer"}


def _linear(x: Tensor, state: dict[str, Tensor], name: str) -> Tensor:
    return F.linear(x, state[f"{name}.weight"], state[f"{name}.bias"])


def _norm(x: Tensor, state: dict[str, Tensor], name: str, eps: float) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], state[f"{name}.weight"], state[f"{name}.bias"], eps)


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | float = 0.0) -> Tensor:
    """Softmax attention over [B, heads, L, d] with an additive ``bias``, heads merged back to [B, L, D]."""
    weights = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias).softmax(-1)
    return (weights @ v).transpose(1, 2).flatten(2)


def _heads(x: Tensor) -> Tensor:
    return x.unflatten(-1, (HEADS, -1)).transpose(1, 2)


@torch.no_grad()
def reference_scores(state: dict[str, Tensor], pixels: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
    """ImageReward's standardised scores computed on the raw tensors, following BLIP's ``vit.py`` and
    ``med.py`` (BERT's additive -10000 mask) and ``ImageReward.score``."""
    vit, bert = "blip.visual_encoder.", "blip.text_encoder."
    x = F.conv2d(pixels, state[f"{vit}patch_embed.proj.weight"], state[f"{vit}patch_embed.proj.bias"], stride=PATCH)
    x = torch.cat([state[f"{vit}cls_token"].expand(len(x), -1, -1), x.flatten(2).transpose(1, 2)], 1)
    x = x + state[f"{vit}pos_embed"]
    for index in range(LAYERS):
        block = f"{vit}blocks.{index}."
        qkv = _linear(_norm(x, state, block + "norm1", 1e-6), state, block + "attn.qkv")
        q, k, v = qkv.unflatten(-1, (3, HEADS, -1)).permute(2, 0, 3, 1, 4)
        x = x + _linear(_attend(q, k, v), state, block + "attn.proj")
        h = F.gelu(_linear(_norm(x, state, block + "norm2", 1e-6), state, block + "mlp.fc1"))
        x = x + _linear(h, state, block + "mlp.fc2")
    image = _norm(x, state, f"{vit}norm", 1e-6)

    h = (
        state[f"{bert}embeddings.word_embeddings.weight"][ids]
        + state[f"{bert}embeddings.position_embeddings.weight"][: ids.shape[1]]
    )
    h = _norm(h, state, f"{bert}embeddings.LayerNorm", 1e-12)
    padding = (1.0 - mask[:, None, None, :].float()) * -10000.0
    for index in range(LAYERS):
        layer = f"{bert}encoder.layer.{index}."
        for attention, bias in (("attention", padding), ("crossattention", 0.0)):
            source = image if attention == "crossattention" else h
            q = _heads(_linear(h, state, f"{layer}{attention}.self.query"))
            k = _heads(_linear(source, state, f"{layer}{attention}.self.key"))
            v = _heads(_linear(source, state, f"{layer}{attention}.self.value"))
            out = _linear(_attend(q, k, v, bias), state, f"{layer}{attention}.output.dense")
            h = _norm(out + h, state, f"{layer}{attention}.output.LayerNorm", 1e-12)
        out = _linear(F.gelu(_linear(h, state, layer + "intermediate.dense")), state, layer + "output.dense")
        h = _norm(out + h, state, layer + "output.LayerNorm", 1e-12)
    raw = h[:, 0]
    for index in (0, 2, 4, 6, 7):
        raw = _linear(raw, state, f"mlp.layers.{index}")
    return (raw.squeeze(-1) - RAW_MEAN) / RAW_STD
