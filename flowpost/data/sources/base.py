"""What acquisition asks of the source of a captioned dataset: its items, the fingerprint and the DVC dependencies
of what it reads, and where it reads from. ``where`` is always the dataset's config path (``datasets.<name>``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Generic, TypeVar

from flowpost.core.config.schema.captioned import CaptionedDataset
from flowpost.data.sources.items import PairItem, SourceItem

ConfigT = TypeVar("ConfigT", bound=CaptionedDataset)


class CaptionedSource(ABC, Generic[ConfigT]):
    """Reads one dataset of the source whose model is ``ConfigT``."""

    def __init__(self, config: ConfigT) -> None:
        self.config = config

    @abstractmethod
    def items(self, *, where: str) -> Iterator[SourceItem | PairItem]:
        """Its items, read one at a time, not yet decoded."""

    @abstractmethod
    def fingerprint(self, *, where: str) -> str:
        """Hash of what it reads: any change to one of its files reruns its acquisition."""

    def dependencies(self, *, where: str) -> list[str]:
        """The files and folders it reads, as DVC dependencies."""
        return [self.config.path] if self.config.path is not None else []

    def location(self) -> str:
        """Where it reads from, for manifests and logs."""
        return str(self.config.path)
