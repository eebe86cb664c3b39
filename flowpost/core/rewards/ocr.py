"""Text rendering reward ``ocr``: how closely the text read from an image matches the prompt's quoted text.

Flow-GRPO's definition: with ``target`` the quoted text and ``read`` the OCR'd text, both without
whitespace and lower-cased, the score is 1 if ``target`` occurs in ``read``, else
``1 - min(edit_distance(read, target), len(target)) / len(target)``. Text is read with RapidOCR's
PP-OCR ONNX models, which ship inside the ``rapidocr-onnxruntime`` package (the ``ocr`` extra).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import numpy as np
import torch
from torch import Tensor

from flowpost.errors import FlowpostError

logger = logging.getLogger(__name__)

QUOTED = re.compile(r'"([^"]*)"|“([^”]*)”')  # straight or typographic double quotes
WHITESPACE = re.compile(r"\s+")
DEVICES = ("cpu", "cuda")
CUDA_PROVIDER = "CUDAExecutionProvider"


def quoted_text(prompt: str) -> str:
    """The text inside the prompt's double-quoted spans, joined in order ('' when there is none)."""
    return "".join(straight or typographic for straight, typographic in QUOTED.findall(prompt))


def normalise_text(text: str, *, case_sensitive: bool = False) -> str:
    """``text`` without whitespace, lower-cased unless ``case_sensitive``."""
    text = WHITESPACE.sub("", text)
    return text if case_sensitive else text.lower()


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest single-character insertions, deletions and substitutions from a to b."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def text_similarity(target: str, read: str) -> float:
    """1 - normalised edit distance of ``read`` to a non-empty ``target`` (both already normalised).

    ``target`` occurring anywhere in ``read`` scores 1; the distance is capped at ``len(target)``, so
    the score lies in [0, 1] however much unrelated text was read.
    """
    if not target:
        raise ValueError("the target text is empty")
    if target in read:
        return 1.0
    return 1.0 - min(edit_distance(read, target), len(target)) / len(target)


class OcrReward:
    """1 - normalised edit distance between each prompt's quoted text and the text read from its image.

    ``device`` is ``cpu`` (default) or ``cuda`` (ONNX Runtime's CUDA execution provider, which needs
    ``onnxruntime-gpu``; without it the models run on the CPU and a warning says so). Text lines read
    with a confidence below ``min_confidence`` are dropped; images are scaled down so that their longer
    side is at most ``max_side`` pixels before text detection. Case is ignored unless ``case_sensitive``.
    """

    name = "ocr"

    def __init__(
        self,
        *,
        device: str = "cpu",
        min_confidence: float = 0.5,
        max_side: int = 960,
        case_sensitive: bool = False,
    ) -> None:
        if device not in DEVICES:
            raise FlowpostError(f"device must be one of {', '.join(DEVICES)}, got {device!r}", where="options.device")
        number = isinstance(min_confidence, int | float) and not isinstance(min_confidence, bool)
        if not number or not 0 <= min_confidence <= 1:
            raise FlowpostError(
                f"min_confidence must be a number in [0, 1], got {min_confidence!r}", where="options.min_confidence"
            )
        if isinstance(max_side, bool) or not isinstance(max_side, int) or max_side < 32:
            raise FlowpostError(f"max_side must be an integer >= 32, got {max_side!r}", where="options.max_side")
        if not isinstance(case_sensitive, bool):
            raise FlowpostError(
                f"case_sensitive must be true or false, got {case_sensitive!r}", where="options.case_sensitive"
            )
        try:
            import onnxruntime
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as exc:
            raise FlowpostError(
                f"reward 'ocr' needs the 'ocr' extra (RapidOCR with its bundled models, {exc}); install it with "
                "pip install 'flowpost[ocr]'"
            ) from None
        cuda = device == "cuda"
        self.case_sensitive = case_sensitive
        self.engine = RapidOCR(
            use_cls=False,  # no 180-degree text classifier, as in Flow-GRPO
            text_score=float(min_confidence),
            det_limit_type="max",
            det_limit_side_len=max_side,
            det_use_cuda=cuda,
            cls_use_cuda=cuda,
            rec_use_cuda=cuda,
        )
        available = onnxruntime.get_available_providers()
        self.on_gpu = cuda and CUDA_PROVIDER in available
        if cuda and not self.on_gpu:
            logger.warning(
                "reward 'ocr': the CUDA execution provider is not available (only %s); reading text on the CPU. "
                "Install onnxruntime-gpu in place of onnxruntime to use the GPU.",
                ", ".join(available),
            )

    @staticmethod
    def prompt_problem(prompt: str) -> str | None:
        """Why ``prompt`` cannot be scored (it quotes no text to render), or None."""
        if normalise_text(quoted_text(prompt)):
            return None
        return "ocr scores the text in double quotes of each prompt, and this one has none; quote the text to render"

    def read(self, image: np.ndarray) -> str:
        """The text read from one uint8 image [H, W] or [H, W, 3] (RGB), its lines joined top to bottom."""
        pixels = image if image.ndim == 2 else np.ascontiguousarray(image[..., ::-1])  # RapidOCR reads BGR arrays
        lines, _ = self.engine(pixels)
        return "".join(line[1] for line in lines or [])

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        if media.ndim != 4 or media.shape[1] not in (1, 3):
            raise FlowpostError(
                f"ocr needs grayscale or RGB media [B, 1 or 3, H, W], got {tuple(media.shape)}", where="rewards"
            )
        if len(prompts) != media.shape[0]:
            raise FlowpostError(f"ocr got {media.shape[0]} images and {len(prompts)} prompts", where="rewards")
        targets = [normalise_text(quoted_text(prompt), case_sensitive=self.case_sensitive) for prompt in prompts]
        for prompt, target in zip(prompts, targets, strict=True):
            if not target:
                raise FlowpostError(
                    f"ocr scores the text in double quotes of each prompt; {prompt!r} has none", where="rewards"
                )
        pixels = (media.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
        images = pixels.permute(0, 2, 3, 1).cpu().numpy()
        scores = []
        for image, target in zip(images, targets, strict=True):
            read = self.read(image[..., 0] if image.shape[-1] == 1 else image)
            scores.append(text_similarity(target, normalise_text(read, case_sensitive=self.case_sensitive)))
        return torch.tensor(scores, dtype=torch.float32, device=media.device)
