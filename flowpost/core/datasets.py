"""Dataset sources, a plugin kind: a source acquires the datasets whose ``source`` it names, and carries their
config model (a ``StoredDataset`` whose ``source`` is fixed to that name).

The built-ins (captioned media, prompt files) are acquired by ``flowpost.tasks.acquire``; a package adds a
source through the entry point group ``flowpost.datasets``. Its model validates ``datasets.<name>`` like a
built-in's, with errors naming that path.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import create_model

from flowpost.core.plugins import Registry, is_path
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.config.schema.dataset_base import StoredDataset

DATASETS: dict[str, str] = {
    "edit-pairs": "flowpost.tasks.acquire:EditPairsSource",
    "hf-dataset": "flowpost.tasks.acquire:HfDatasetSource",
    "image-folder": "flowpost.tasks.acquire:ImageFolderSource",
    "preference-pairs": "flowpost.tasks.acquire:PreferencePairsSource",
    "prompt-files": "flowpost.tasks.acquire:PromptFilesSource",
    "table": "flowpost.tasks.acquire:TableSource",
    "video-folder": "flowpost.tasks.acquire:VideoFolderSource",
    "webdataset": "flowpost.tasks.acquire:WebShardsSource",
}
DATASET_REGISTRY = Registry(
    "dataset source",
    plural="dataset sources",
    group="flowpost.datasets",
    builtins=DATASETS,
    base="flowpost.core.datasets:DatasetSource",
)


class DatasetSource(ABC):
    """Acquires one dataset described by ``config``, an instance of ``model``."""

    model: ClassVar[type[StoredDataset]]

    def __init__(self, config: StoredDataset) -> None:
        self.config = config

    @abstractmethod
    def acquire(self, out_dir: Path, *, smoke: bool, where: str) -> dict[str, Any]:
        """Write the dataset into ``out_dir`` (shards or prompts, ``manifest.json``) and return the manifest: its
        ``counts``, ``train_prompts`` and ``eval_prompts`` (``{"prompt": ..., **metadata}`` each), and
        ``assets``, what its ``assets/`` folder holds, when it writes one."""


def source_model(name: str, *, where: str) -> type[StoredDataset]:
    """The config model of the plugin source registered as ``name`` (importing it registers the model); a source
    named by its class path (``package.module:Class``) gets its model with ``source`` fixed to that path."""
    model: type[StoredDataset] = DATASET_REGISTRY.load(name, where=where).model
    if is_path(name):
        return _named_by_path(model, name)
    if model.model_fields["source"].default != name:
        raise FlowpostError(
            f"dataset source {name!r} carries the model {model.__qualname__}, whose source is "
            f"{model.model_fields['source'].default!r}; fix the source of the model or the entry point's name",
            where=where,
        )
    return model


@cache
def _named_by_path(model: type[StoredDataset], path: str) -> type[StoredDataset]:
    """``model`` whose ``source`` is ``path``, so a pipeline file naming the source by its class path validates and
    dumps that path (defining it registers it under the path)."""
    return create_model(  # type: ignore[call-overload,no-any-return]
        model.__name__, __base__=model, __module__=model.__module__, source=(Literal[path], path)
    )
