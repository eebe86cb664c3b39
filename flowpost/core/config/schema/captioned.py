"""The sources of captioned media (or preference pairs) the user brings: folders and tables of files, webdataset
shards and Hugging Face datasets."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from flowpost.core.config.schema.dataset_base import StoredDataset
from flowpost.core.config.schema.media import FrameSampling, HubDataset, PreprocessConfig, SplitConfig

IMAGE_MEMBERS = ("png", "jpg", "jpeg", "webp", "bmp", "gif", "tif", "tiff", "npy")  # webdataset image extensions
CAPTION_MEMBERS = ("txt", "json")  # webdataset caption extensions: plain text, or a JSON object's caption field


class CaptionedDataset(StoredDataset):
    """Captioned media, decoded and preprocessed alike, with a held-out split and a bound on bad items."""

    caption_column: str | None = Field(
        None, description="the caption field (webdataset: of the JSON member); default text, caption"
    )
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    max_caption_chars: int | None = Field(None, ge=1, description="longer captions are bad items; default: no limit")
    max_bad_fraction: float = Field(0.05, ge=0, le=1, description="more bad items than this fails the node")

    def image_channels(self) -> int:
        """1 for ``preprocess.mode: grayscale``, else 3."""
        return 1 if self.preprocess.mode == "grayscale" else 3

    def holds_out(self) -> bool:
        """Whether ``split.eval`` holds items out."""
        return self.split.eval > 0


class FileDataset(CaptionedDataset):
    """Captioned media in a file or folder at ``path`` (relative to the working directory; what it reads is a
    source fingerprint), whose image paths stay inside it unless ``allow_outside``."""

    READS_PATH = True

    path: str = Field(description="the folder or table the dataset is read from")
    allow_outside: bool = Field(
        False,
        description="image paths may leave the dataset's folder (absolute, '..', a symlink out); off, such a path "
        "is an error",
    )


class ImageFolderDataset(FileDataset):
    """Images under a folder, captioned by a metadata table or a sidecar ``.txt``."""

    source: Literal["image-folder"] = "image-folder"
    path: str = Field(description="a folder of images")


class TableDataset(FileDataset):
    """A ``.parquet`` / ``.csv`` / ``.jsonl`` of captions and images."""

    source: Literal["table"] = "table"
    path: str = Field(description="a .parquet/.csv/.jsonl file")
    image_column: str = Field("image", description="the field holding image bytes, a {bytes, path} struct or a path")


class VideoFolderDataset(FileDataset):
    """Clips under a folder, captioned like an image folder; ``frames`` says which frames each keeps."""

    source: Literal["video-folder"] = "video-folder"
    path: str = Field(description="a folder of clips")
    frames: FrameSampling = Field(default_factory=FrameSampling)


class PreferencePairsDataset(FileDataset):
    """A caption with a chosen and a rejected image, from a table or a folder with ``chosen/`` and ``rejected/``."""

    source: Literal["preference-pairs"] = "preference-pairs"
    path: str = Field(description="a .parquet/.csv/.jsonl table, or a folder with chosen/ and rejected/")
    chosen_column: str = Field("chosen", description="a table's field of the preferred image")
    rejected_column: str = Field("rejected", description="a table's field of the dispreferred image")


class EditPairsDataset(FileDataset):
    """Edits from a table: an instruction, a source image and the target image the instruction should give;
    the sources are kept in the dataset's ``assets/sources/``, where its conditions node reads them."""

    WRITES_ASSETS = True

    source: Literal["edit-pairs"] = "edit-pairs"
    path: str = Field(description="a .parquet/.csv/.jsonl table of instructions, source and target images")
    caption_column: str | None = Field("instruction", description="the field holding each edit's instruction")
    source_column: str = Field("source", description="the field of the image the instruction applies to")
    target_column: str = Field("target", description="the field of the image the edit should give")
    more_source_columns: list[str] = Field(
        [], description="the fields of further source images, in order (Picture 2, 3, ...: qwen-image-edit-plus)"
    )


class WebShardsDataset(CaptionedDataset):
    """Existing ``.tar`` shards, local or at fsspec URLs, read as a stream."""

    source: Literal["webdataset"] = "webdataset"
    shards: str | list[str] = Field(
        description="a brace pattern of .tar shards ('shards/train-{000000..000009}.tar'), a URL or a list of them"
    )
    image_keys: list[str] = Field(
        ["png", "jpg", "jpeg", "webp", "npy"], min_length=1, description="image member extensions, in order"
    )
    caption_keys: list[str] = Field(["txt", "json"], min_length=1, description="caption member extensions")

    @field_validator("shards")
    @classmethod
    def _some_shards(cls, shards: str | list[str]) -> str | list[str]:
        if not shards:
            raise ValueError("names no shard; give a brace pattern, a URL or a list of them")
        return shards

    @field_validator("image_keys", "caption_keys")
    @classmethod
    def _readable_members(cls, keys: list[str], info: Any) -> list[str]:
        allowed = IMAGE_MEMBERS if info.field_name == "image_keys" else CAPTION_MEMBERS
        foreign = [key for key in keys if key.rpartition(".")[2].lower() not in allowed]
        if foreign:
            raise ValueError(f"{', '.join(foreign)}: only members ending in {', '.join(allowed)} are read")
        return keys


class HfDataset(CaptionedDataset):
    """A ``datasets`` dataset: a folder written by ``save_to_disk`` (``path``) or one on the hub (``hub``)."""

    READS_PATH = True

    source: Literal["hf-dataset"] = "hf-dataset"
    path: str | None = Field(None, description="a folder written by save_to_disk")
    hub: HubDataset | None = Field(None, description="a hub dataset instead of a save_to_disk path")
    image_column: str = Field("image", description="the field holding image bytes, a {bytes, path} struct or a path")

    @model_validator(mode="after")
    def _path_or_hub(self) -> HfDataset:
        if (self.path is None) == (self.hub is None):
            raise ValueError("source 'hf-dataset' reads one of 'path' (a save_to_disk folder) and 'hub'")
        return self
