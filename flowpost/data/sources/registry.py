"""The source that reads each kind of captioned dataset, by its config model: a new source adds one entry."""

from __future__ import annotations

from typing import Any

from flowpost.core.config.schema import captioned as models
from flowpost.data.sources.base import CaptionedSource
from flowpost.data.sources.edit_pairs import EditPairsSource
from flowpost.data.sources.hf_dataset import HfSource
from flowpost.data.sources.image_folder import ImageFolderSource
from flowpost.data.sources.preference_pairs import PairsSource
from flowpost.data.sources.table import TableSource
from flowpost.data.sources.video_folder import VideoFolderSource
from flowpost.data.sources.web_shards import WebShardsSource

SOURCE_READERS: dict[type[models.CaptionedDataset], type[CaptionedSource[Any]]] = {
    models.ImageFolderDataset: ImageFolderSource,
    models.TableDataset: TableSource,
    models.VideoFolderDataset: VideoFolderSource,
    models.PreferencePairsDataset: PairsSource,
    models.EditPairsDataset: EditPairsSource,
    models.WebShardsDataset: WebShardsSource,
    models.HfDataset: HfSource,
}


def source_for(config: models.CaptionedDataset) -> CaptionedSource[Any]:
    """The source that reads the dataset ``config`` describes."""
    return SOURCE_READERS[type(config)](config)
