"""How a dataset is acquired: one model per ``source``, holding the fields that source reads, and
``DatasetConfig``, which picks the model by ``source``: a built-in's, or the one a plugin source carries."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, cast

from pydantic import Field, SerializeAsAny, WrapValidator

from flowpost.core.config.schema.dataset_base import SOURCES, DatasetBase, StoredDataset
from flowpost.core.config.schema.names import unknown
from flowpost.core.config.schema.sampled import SampledPairsConfig, TrajectoriesConfig
from flowpost.core.plugins import is_path
from flowpost.errors import FlowpostError


class PromptFilesDataset(StoredDataset):
    """Prompts (and their metadata) from files, without media."""

    READS_PATH = True

    source: Literal["prompt-files"] = "prompt-files"
    path: str = Field(
        description="a .txt/.jsonl/.csv/.parquet file or a folder of them, relative to the working directory; its "
        "contents are a source fingerprint"
    )


class SampledDataset(DatasetBase):
    """A dataset a finished stage samples (it has no path and no split): ``sampled`` names the stage, the
    prompts and the condition cache, in the field ``SAMPLED_FIELD``."""

    SAMPLED_FIELD: ClassVar[str]

    @property
    def sampled(self) -> TrajectoriesConfig | SampledPairsConfig:
        """The block that says what is sampled from which stage."""
        return getattr(self, self.SAMPLED_FIELD)


class TrajectoriesDataset(SampledDataset):
    """Teacher ODE trajectories sampled from a finished stage."""

    SAMPLED_FIELD = "trajectories"

    source: Literal["teacher-trajectories"] = "teacher-trajectories"
    trajectories: TrajectoriesConfig = Field(description="the teacher stage, its prompts and what to sample")


class SampledPairsDataset(SampledDataset):
    """Preference pairs sampled from a trained stage and ranked by rewards."""

    SAMPLED_FIELD = "sample"

    source: Literal["sampled-pairs"] = "sampled-pairs"
    sample: SampledPairsConfig = Field(description="the stage, prompts and ranking")


def dataset_config(data: Any) -> DatasetConfig:
    """The model of ``data``'s ``source``, validated; its errors name the dataset's fields, never the source. A
        source no built-in model has is looked up among the plugin sources (entry point group ``flowpost.datasets``), or
    imported when written as ``package.module:Class``."""
    if isinstance(data, DatasetBase):
        return cast("DatasetConfig", data)
    if not isinstance(data, dict) or "source" not in data:
        raise ValueError(f"give a mapping with a source: one of {', '.join(_source_names())}")
    name = data["source"]
    model = SOURCES.get(name) if isinstance(name, str) else None
    if model is None and isinstance(name, str):
        model = _plugin_model(name)
    if model is None:
        raise ValueError(unknown("source", name, _source_names()))
    return cast("DatasetConfig", model.model_validate(data))


def _plugin_model(name: str) -> type[DatasetBase] | None:
    """The model of the plugin source ``name`` (an entry point's name or a class path); None when no installed
    package declares the name."""
    from flowpost.core.datasets import DATASET_REGISTRY, source_model

    if not is_path(name) and name not in DATASET_REGISTRY.entries(where="datasets"):
        return None
    try:
        return source_model(name, where="datasets")
    except FlowpostError as exc:
        raise ValueError(str(exc).removeprefix("datasets: ")) from None


def _source_names() -> list[str]:
    """The sources of the built-in models and of the installed plugins."""
    from flowpost.core.datasets import DATASET_REGISTRY

    return sorted({*SOURCES, *DATASET_REGISTRY.entries(where="datasets")})


# each dataset is serialised by its own model, a plugin's too
DatasetConfig = Annotated[SerializeAsAny[DatasetBase], WrapValidator(lambda data, _: dataset_config(data))]
