"""Each dataset source is one model in the ``DatasetConfig`` union, and captioned ones have a reader."""

from __future__ import annotations

from typing import get_args

from flowpost.core.config.schema import SOURCES, CaptionedDataset, DatasetConfig
from flowpost.data.sources.registry import SOURCE_READERS


def test_every_source_model_is_a_member_of_the_union() -> None:
    members = get_args(get_args(DatasetConfig)[0])
    assert set(members) == set(SOURCES.values())


def test_every_captioned_source_has_a_reader() -> None:
    captioned = {model for model in SOURCES.values() if issubclass(model, CaptionedDataset)}
    assert captioned == set(SOURCE_READERS)
