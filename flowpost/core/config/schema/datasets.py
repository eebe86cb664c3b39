"""How a dataset is acquired: one model per ``source``, holding the fields that source reads, and
``DatasetConfig``, their union, which picks the model by ``source``."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, cast

from pydantic import Field, WrapValidator

from flowpost.core.config.schema import captioned
from flowpost.core.config.schema.dataset_base import SOURCES, DatasetBase, StoredDataset
from flowpost.core.config.schema.names import unknown
from flowpost.core.config.schema.sampled import SampledPairsConfig, TrajectoriesConfig


class DigitsDataset(StoredDataset):
    """The built-in digits (scikit-learn's 8x8), upscaled to ``image_size``, with the digit classifiers."""

    source: Literal["builtin-digits"] = "builtin-digits"
    image_size: int = Field(16, ge=8, le=64, multiple_of=4)
    test_fraction: float = Field(0.2, gt=0, lt=1)


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
    """The model of ``data``'s ``source``, validated; its errors name the dataset's fields, never the source."""
    if isinstance(data, DatasetBase):
        return cast("DatasetConfig", data)
    if not isinstance(data, dict) or "source" not in data:
        raise ValueError(f"give a mapping with a source: one of {', '.join(sorted(SOURCES))}")
    model = SOURCES.get(data["source"]) if isinstance(data["source"], str) else None
    if model is None:
        raise ValueError(unknown("source", data["source"], SOURCES))
    return cast("DatasetConfig", model.model_validate(data))


DatasetConfig = Annotated[
    DigitsDataset
    | PromptFilesDataset
    | captioned.ImageFolderDataset
    | captioned.TableDataset
    | captioned.VideoFolderDataset
    | captioned.PreferencePairsDataset
    | captioned.WebShardsDataset
    | captioned.HfDataset
    | TrajectoriesDataset
    | SampledPairsDataset,
    Field(discriminator="source"),  # serialises (and describes) each dataset by its own model
    WrapValidator(lambda data, _: dataset_config(data)),
]
