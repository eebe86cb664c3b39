"""Each built-in dataset source is registered with the model it carries, and captioned ones have a reader."""

from __future__ import annotations

from flowpost.core.config.schema import SOURCES, CaptionedDataset, SampledDataset
from flowpost.core.datasets import DATASET_REGISTRY, DATASETS
from flowpost.data.sources.registry import SOURCE_READERS

BUILT_IN = {name: model for name, model in SOURCES.items() if model.__module__.startswith("flowpost.")}


def test_every_built_in_acquired_source_is_registered_with_its_model() -> None:
    acquired = {name for name, model in BUILT_IN.items() if not issubclass(model, SampledDataset)}
    assert set(DATASETS) == acquired
    for name in DATASETS:
        assert DATASET_REGISTRY.load(name, where=f"datasets.{name}").model is BUILT_IN[name]


def test_every_captioned_source_has_a_reader() -> None:
    captioned = {model for model in BUILT_IN.values() if issubclass(model, CaptionedDataset)}
    assert captioned == set(SOURCE_READERS)
