"""A dataset source from a package outside flowpost (entry point group ``flowpost.datasets``): its model
validates ``datasets.<name>`` with the config paths of a built-in, and its class acquires the dataset."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_site import on_path, write_distribution

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict, validate_pipeline
from flowpost.core.config.schema import SOURCES, dataset_config
from flowpost.errors import FlowpostError
from flowpost.tasks.acquire import acquire_dataset

LINES = """
import json
from typing import Literal

from pydantic import Field

from flowpost.core.config.schema.dataset_base import StoredDataset
from flowpost.core.datasets import DatasetSource


class LinesDataset(StoredDataset):
    source: Literal["numbered-lines"] = "numbered-lines"
    count: int = Field(3, ge=1, description="how many prompts")


class Lines(DatasetSource):
    model = LinesDataset

    def acquire(self, out_dir, *, smoke, where):
        prompts = [f"line {i}" for i in range(self.config.count)]
        manifest = {"counts": {"prompts": len(prompts)}, "train_prompts": prompts, "eval_prompts": []}
        (out_dir / "manifest.json").write_text(json.dumps(manifest))
        return manifest


class Misnamed(Lines):
    pass
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The package ``lines_source`` declaring ``numbered-lines`` and ``other-name`` (whose model says
    ``numbered-lines``); the models it registers are dropped afterwards."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "lines_source.py").write_text(LINES)
    points = {"numbered-lines": "lines_source:Lines", "other-name": "lines_source:Misnamed"}
    write_distribution(site, "lines-source", {"flowpost.datasets": points})
    known = set(SOURCES)
    with on_path(site, monkeypatch):
        yield site
    for name in set(SOURCES) - known:
        del SOURCES[name]


def _pipeline(dataset: dict[str, object]) -> dict[str, object]:
    """The default pipeline with ``dataset`` as ``datasets.lines``."""
    pipeline = pipeline_to_dict(load_pipeline(None))
    pipeline["datasets"]["lines"] = dataset
    return pipeline


def test_a_plugin_source_validates_and_acquires(site: Path, tmp_path: Path) -> None:
    config = dataset_config({"source": "numbered-lines", "count": 2})
    assert type(config).__module__ == "lines_source" and config.model_dump()["count"] == 2
    manifest = acquire_dataset(config, tmp_path, where="datasets.lines")
    assert manifest["train_prompts"] == ["line 0", "line 1"]
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest


def test_a_plugin_source_s_bad_field_names_its_config_path(site: Path) -> None:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(_pipeline({"source": "numbered-lines", "count": 0}))
    assert "datasets.lines.count: Input should be greater than or equal to 1" in str(info.value)
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(_pipeline({"source": "numbered-lines", "caption_column": "text"}))
    assert "datasets.lines: caption_column do not apply to source 'numbered-lines'" in str(info.value)


def test_a_plugin_whose_model_names_another_source_is_refused(site: Path) -> None:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(_pipeline({"source": "other-name"}))
    assert "dataset source 'other-name' carries the model LinesDataset, whose source is 'numbered-lines'" in str(
        info.value
    )


def test_an_unknown_source_lists_the_plugin_sources(site: Path) -> None:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(_pipeline({"source": "numbered-line"}))
    assert "numbered-lines" in str(info.value) and "builtin-digits" in str(info.value)


def test_a_source_named_by_its_class_path_validates_dumps_and_acquires(site: Path, tmp_path: Path) -> None:
    pipeline = validate_pipeline(_pipeline({"source": "lines_source:Lines", "count": 2}))
    dataset = pipeline.datasets["lines"]
    dumped = pipeline_to_dict(pipeline)["datasets"]["lines"]
    assert (dumped["source"], dumped["count"]) == ("lines_source:Lines", 2)
    assert validate_pipeline(pipeline_to_dict(pipeline)).datasets["lines"] == dataset  # its dump reads back
    manifest = acquire_dataset(dataset, tmp_path, where="datasets.lines")
    assert manifest["train_prompts"] == ["line 0", "line 1"]


def test_a_class_path_source_s_bad_field_and_missing_class_name_their_config_path(site: Path) -> None:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(_pipeline({"source": "lines_source:Lines", "count": 0}))
    assert "datasets.lines.count: Input should be greater than or equal to 1" in str(info.value)
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(_pipeline({"source": "lines_source:Absent"}))
    assert "datasets.lines" in str(info.value) and "lines_source:Absent" in str(info.value)
