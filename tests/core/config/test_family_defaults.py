"""Trainer defaults resolved from the model family: no caption dropout for a guidance-distilled family."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from flowpost.core.config.schema import StageConfig
from flowpost.core.models.registry import adapter_class


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Captures flowpost's warnings (its logger does not propagate to the root)."""
    logger = logging.getLogger("flowpost")
    logger.addHandler(caplog.handler)
    caplog.handler.setLevel(logging.WARNING)
    yield caplog
    logger.removeHandler(caplog.handler)


def _stage(family: str, **train: float) -> StageConfig:
    model = {"family": family} if family == "tiny-sd3" else {"family": family, "pretrained": "some/pipeline"}
    return StageConfig.model_validate({"trainer": "sft", "model": model, "train": train})


def test_flux1_is_guidance_distilled_and_the_others_are_not() -> None:
    assert adapter_class("flux1").guidance_distilled and adapter_class("flux2").guidance_distilled
    others = ("tiny-sd3", "sd3", "qwen-image", "wan2", "z-image", "flux2-klein")  # their base models sample with CFG
    assert not any(adapter_class(family).guidance_distilled for family in others)


@pytest.mark.parametrize(
    ("family", "dropout"),
    [("flux1", 0.0), ("tiny-sd3", 0.1), ("sd3", 0.1), ("qwen-image", 0.1), ("z-image", 0.1), ("flux2", 0.0)],
)
def test_the_cfg_dropout_default_follows_the_family(family: str, dropout: float) -> None:
    assert _stage(family).arguments().cfg_dropout == dropout


def test_an_explicit_cfg_dropout_is_kept_with_a_warning_on_a_distilled_family(
    warnings: pytest.LogCaptureFixture,
) -> None:
    assert _stage("flux1", cfg_dropout=0.2).arguments().cfg_dropout == 0.2
    assert "guidance-distilled" in warnings.text and "cfg_dropout" in warnings.text
    warnings.clear()
    assert _stage("flux1", cfg_dropout=0.0).arguments().cfg_dropout == 0.0
    assert _stage("tiny-sd3", cfg_dropout=0.2).arguments().cfg_dropout == 0.2
    assert "guidance-distilled" not in warnings.text
