"""Source ``hf-dataset``: a ``datasets`` dataset, from a ``save_to_disk`` folder or the hub.

Rows are read like a table's: ``image_column`` holds an ``Image`` feature (read as its encoded
bytes or file, never through the library's decoder), bytes or a path; ``caption_column`` (default
``text``, then ``caption``) the caption; the other columns become metadata. A hub dataset is pinned
to the commit its revision names when it is fingerprinted; with ``HF_HUB_OFFLINE`` (or
``HF_DATASETS_OFFLINE``) set, only a commit in ``hub.revision`` can be, and its files must be cached.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flowpost.core.config.schema.captioned import HfDataset
from flowpost.core.config.schema.media import HubDataset
from flowpost.core.io import sha256_json
from flowpost.data.file_hashes import files_fingerprint
from flowpost.data.sources.base import CaptionedSource
from flowpost.data.sources.image_folder import folder_files
from flowpost.data.sources.items import SourceItem, caption_field, image_cell, json_metadata
from flowpost.errors import FlowpostError, TransientError

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


class HfSource(CaptionedSource[HfDataset]):
    """Reads an ``hf-dataset`` dataset: a saved folder (``path``) or a hub dataset (``hub``, which DVC does not
    track: its params pin it)."""

    def items(self, *, where: str) -> Iterator[SourceItem]:
        c = self.config
        path = Path(c.path) if c.path is not None else None
        return hf_items(path=path, hub=c.hub, caption_column=c.caption_column, image_column=c.image_column, where=where)

    def fingerprint(self, *, where: str) -> str:
        if self.config.hub is not None:
            return hub_fingerprint(self.config.hub, where=f"{where}.hub")
        assert self.config.path is not None
        return saved_fingerprint(Path(self.config.path), where=f"{where}.path")

    def location(self) -> str:
        return f"hub:{self.config.hub.id}" if self.config.hub is not None else str(self.config.path)


def offline() -> bool:
    """Whether the environment asks the hub libraries to stay offline."""
    return any(os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE") for name in OFFLINE_VARIABLES)


def saved_fingerprint(root: Path, *, where: str) -> str:
    """Changes when any file of the saved dataset (arrow data, state, info) does."""
    return files_fingerprint(root, folder_files(root, where=where))


def hub_fingerprint(hub: HubDataset, *, where: str) -> str:
    """Hash of the dataset's id, configuration, split and the commit its revision resolves to."""
    return sha256_json({**hub.model_dump(mode="json"), "revision": hub_commit(hub, where=where)})


def hub_commit(hub: HubDataset, *, where: str) -> str:
    """The commit ``hub.revision`` names (a commit is its own; a branch or tag asks the hub)."""
    if hub.revision is not None and COMMIT.match(hub.revision):
        return hub.revision
    if offline():
        raise FlowpostError(
            f"HF_HUB_OFFLINE is set, so the commit of revision {hub.revision or 'main'!r} of {hub.id!r} cannot be "
            "looked up; set hub.revision to a commit whose files are cached, unset HF_HUB_OFFLINE, or save the "
            "dataset with save_to_disk and set path instead",
            where=where,
        )
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi(endpoint=os.environ.get("HF_ENDPOINT")).dataset_info(hub.id, revision=hub.revision)
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        problem = exc.__class__.__name__
        raise FlowpostError(f"{problem} for {hub.id!r}; fix hub.id or hub.revision", where=where) from None
    except OSError as exc:
        raise TransientError(f"the hub did not answer for {hub.id!r} ({exc}); retry", where=where) from None
    assert info.sha is not None
    return info.sha


def hf_items(
    *, path: Path | None, hub: HubDataset | None, caption_column: str | None, image_column: str, where: str
) -> Iterator[SourceItem]:
    """One item per row, named by its row number."""
    if path is not None:
        dataset, base, source = _saved(path, where=f"{where}.path"), path, str(path)
    else:
        assert hub is not None
        dataset, base, source = _hub(hub, where=f"{where}.hub"), Path.cwd(), f"{hub.id} ({hub.split})"
    if image_column not in dataset.column_names:
        columns = ", ".join(dataset.column_names)
        raise FlowpostError(f"no image column {image_column!r} (columns: {columns}); set image_column", where=where)
    dataset = _undecoded(dataset, image_column)
    for number, row in enumerate(dataset, start=1):
        column, caption = caption_field(row, caption_column)
        extra = {k: v for k, v in row.items() if k not in (image_column, column)}
        image = image_cell(base, row[image_column], allow_outside=True, where=f"{source}: row {number}")  # cache paths
        yield SourceItem(f"row-{number}", f"{source}: row {number}", image, caption, json_metadata(extra))


def _saved(path: Path, *, where: str) -> Any:
    from datasets import Dataset, DatasetDict, load_from_disk

    try:
        dataset = load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise FlowpostError(f"{exc}; give a folder written by save_to_disk", where=where) from None
    if isinstance(dataset, DatasetDict):
        splits = ", ".join(dataset)
        raise FlowpostError(
            f"{path} holds several splits ({splits}); set path to one of them, e.g. {path}/{next(iter(dataset))}",
            where=where,
        )
    assert isinstance(dataset, Dataset)
    return dataset


def _hub(hub: HubDataset, *, where: str) -> Any:
    from datasets import load_dataset

    commit = hub_commit(hub, where=where)
    try:
        return load_dataset(hub.id, hub.name, split=hub.split, revision=commit)
    except (FileNotFoundError, ConnectionError, ValueError) as exc:
        state = "with HF_HUB_OFFLINE set, it is not in the local cache" if offline() else f"{exc}"
        message = f"cannot load {hub.id!r} at {commit} ({state}); fix hub or its cache"
        raise FlowpostError(message, where=where) from None


def _undecoded(dataset: Any, column: str) -> Any:
    """The dataset with an ``Image`` column read as ``{bytes, path}`` structs instead of decoded images."""
    from datasets import Image

    feature = dataset.features[column]
    return dataset.cast_column(column, Image(decode=False)) if isinstance(feature, Image) else dataset
