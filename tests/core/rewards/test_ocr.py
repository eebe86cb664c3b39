from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from flowpost.core.evaluation.registry import build_metric
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.core.rewards.ocr import OcrReward, edit_distance, normalise_text, quoted_text, text_similarity
from flowpost.core.rewards.registry import build_reward
from flowpost.errors import FlowpostError

WHERE = "stages.grpo.rewards.0"
PROMPT = 'a shop sign that says "Hello World"'
# The `ocr` extra installs RapidOCR only on Python < 3.13 (its supported range).
needs_engine = pytest.mark.skipif(
    sys.version_info >= (3, 13) and find_spec("rapidocr_onnxruntime") is None, reason="RapidOCR needs Python < 3.13"
)


def _render(text: str, *, size: tuple[int, int] = (224, 64), channels: int = 3) -> torch.Tensor:
    """[1, channels, H, W] in [0, 1]: black text in Pillow's bundled font on white."""
    image = Image.new("L", size, 255)
    ImageDraw.Draw(image).text((12, 14), text, fill=0, font=ImageFont.load_default(size=30))
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255)
    return pixels.expand(channels, -1, -1).unsqueeze(0)


@pytest.fixture(scope="module")
def offline() -> Iterator[None]:
    """Any attempt to open a network connection fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket, "create_connection", refuse)
        yield


@pytest.fixture(scope="module")
def ocr(offline: None) -> OcrReward:
    return OcrReward()


@pytest.mark.parametrize(
    ("prompt", "quoted"),
    [
        (PROMPT, "Hello World"),
        ('a banner "OPEN" above a door reading "24 h"', "OPEN24 h"),
        ("a neon sign “Café”", "Café"),
        ("a cat on a mat", ""),
        ('an unclosed "quote', ""),
        ('an empty "" span', ""),
    ],
)
def test_quoted_text_joins_every_span(prompt: str, quoted: str) -> None:
    assert quoted_text(prompt) == quoted


def test_normalisation_drops_whitespace_and_case() -> None:
    assert normalise_text(" Hello\tWor ld\n") == "helloworld"
    assert normalise_text("Hello World", case_sensitive=True) == "HelloWorld"


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [("kitten", "sitting", 3), ("", "abc", 3), ("abc", "", 3), ("flaw", "lawn", 2), ("same", "same", 0)],
)
def test_edit_distance(a: str, b: str, distance: int) -> None:
    assert edit_distance(a, b) == edit_distance(b, a) == distance


def test_similarity_is_one_minus_the_capped_normalised_distance() -> None:
    assert text_similarity("helloworld", "helloworld") == 1.0
    assert text_similarity("hello", "xxhelloyy") == 1.0  # the target inside longer text
    assert text_similarity("hello", "hallo") == pytest.approx(0.8)
    assert text_similarity("hello", "hell") == pytest.approx(0.8)
    assert text_similarity("hello", "") == 0.0
    assert text_similarity("ab", "completely different") == 0.0  # capped at len(target)
    with pytest.raises(ValueError, match="empty"):
        text_similarity("", "anything")


@needs_engine
def test_the_models_ship_with_the_package() -> None:
    import rapidocr_onnxruntime

    models = Path(rapidocr_onnxruntime.__file__).parent / "models"
    found = {path.name: path.stat().st_size for path in models.glob("*.onnx")}
    assert {"ch_PP-OCRv4_det_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx"} <= set(found)
    assert all(size > 100_000 for size in found.values())


@needs_engine
def test_rendered_quoted_text_scores_near_one(ocr: OcrReward) -> None:
    media = torch.cat([_render("Hello World"), _render("Goodbye"), torch.ones(1, 3, 64, 224)])
    scores = ocr(media, [PROMPT] * 3, [{}] * 3)
    assert scores.shape == (3,) and scores.dtype == torch.float32
    assert scores[0] > 0.9
    assert scores[1] < 0.5
    assert scores[2] == 0.0  # nothing to read
    single = torch.cat([ocr(image[None], [PROMPT], [{}]) for image in media])
    torch.testing.assert_close(scores, single)  # a batch scores each image on its own


@needs_engine
def test_case_and_grayscale(ocr: OcrReward) -> None:
    media = _render("HELLO WORLD", channels=1)
    assert float(ocr(media, [PROMPT], [{}])) > 0.9
    sensitive = OcrReward(case_sensitive=True)
    assert float(sensitive(media, [PROMPT], [{}])) < 0.5


@needs_engine
def test_prompts_without_quoted_text_and_bad_media_are_refused(ocr: OcrReward) -> None:
    with pytest.raises(FlowpostError, match="'a cat' has none"):
        ocr(torch.ones(2, 3, 32, 32), [PROMPT, "a cat"], [{}, {}])
    with pytest.raises(FlowpostError, match="grayscale or RGB"):
        ocr(torch.ones(1, 4, 32, 32), [PROMPT], [{}])
    with pytest.raises(FlowpostError, match="2 images and 1 prompts"):
        ocr(torch.ones(2, 3, 32, 32), [PROMPT], [{}])
    assert ocr(torch.ones(0, 3, 32, 32), [], []).shape == (0,)


@pytest.mark.parametrize(
    ("options", "option"),
    [({"device": "cuda:0"}, "device"), ({"min_confidence": 2}, "min_confidence"), ({"max_side": 8}, "max_side")],
)
def test_bad_options_name_the_config_path(options: dict[str, object], option: str) -> None:
    with pytest.raises(FlowpostError) as info:
        build_reward("ocr", options=options, where=WHERE)
    assert info.value.where == f"{WHERE}.options.{option}"


def test_the_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)
    with pytest.raises(FlowpostError, match=r"pip install 'flowpost\[ocr\]'"):
        build_reward("ocr", options={}, where=WHERE)


@needs_engine
def test_cuda_falls_back_to_the_cpu_with_a_warning(
    offline: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with caplog.at_level(logging.WARNING, logger="flowpost.core.rewards.ocr"):
        reward = build_reward("ocr", options={"device": "cuda"}, where=WHERE)
    assert not reward.on_gpu and "CUDA execution provider is not available" in caplog.text


@needs_engine
def test_ocr_is_a_metric(offline: None) -> None:
    metric = build_metric("ocr", options={}, where="evaluate.metrics.0", assets_dir=None)
    samples = EvalSamples(images=torch.ones(2, 3, 32, 32), prompts=[PROMPT] * 2, metadata=[{}, {}])
    assert metric.name == "ocr" and metric(samples) == 0.0
