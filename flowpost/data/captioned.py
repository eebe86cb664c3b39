"""Captioned-image sources (``image-folder``, ``table``, ``preference-pairs``) as train and held-out
demonstrations or preference pairs."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flowpost.core.config.schema import DatasetConfig
from flowpost.data.bad_items import BadItems
from flowpost.data.preprocess import training_image
from flowpost.data.records import Demonstration, PreferencePair
from flowpost.data.sources.image_folder import folder_fingerprint, folder_items
from flowpost.data.sources.items import BadItem, SourceItem, caption_text
from flowpost.data.sources.preference_pairs import PairItem, pair_items, pairs_fingerprint
from flowpost.data.sources.table import table_fingerprint, table_items
from flowpost.data.splits import held_out
from flowpost.errors import FlowpostError

PAIRS = "preference-pairs"
Record = Demonstration | PreferencePair


@dataclass
class CaptionedSplit:
    """The demonstrations (or, for ``preference-pairs``, the pairs) of each split and the items skipped as bad."""

    train: list[Record]
    eval: list[Record]
    bad: BadItems

    def splits(self) -> dict[str, list[Record]]:
        return {"train": self.train, "eval": self.eval}


def source_fingerprint(config: DatasetConfig, *, where: str) -> str:
    """Hash of the files an image source reads: any change to one reruns its acquisition."""
    assert config.path is not None
    if config.source == PAIRS:
        columns = {"chosen_column": config.chosen_column, "rejected_column": config.rejected_column}
        return pairs_fingerprint(Path(config.path), **columns, where=f"{where}.path")
    if config.source == "image-folder":
        return folder_fingerprint(Path(config.path), where=f"{where}.path")
    return table_fingerprint(Path(config.path), image_column=config.image_column, where=f"{where}.path")


def source_items(config: DatasetConfig, *, where: str) -> Iterator[SourceItem | PairItem]:
    assert config.path is not None
    if config.source == PAIRS:
        return pair_items(
            Path(config.path),
            caption_column=config.caption_column,
            chosen_column=config.chosen_column,
            rejected_column=config.rejected_column,
            where=f"{where}.path",
        )
    if config.source == "image-folder":
        return folder_items(Path(config.path), caption_column=config.caption_column, where=f"{where}.path")
    return table_items(
        Path(config.path), caption_column=config.caption_column, image_column=config.image_column, where=f"{where}.path"
    )


def captioned_split(config: DatasetConfig, *, where: str) -> CaptionedSplit:
    """Every good item as a demonstration (or pair) in its split; a FlowpostError past ``max_bad_fraction``."""
    split = CaptionedSplit([], [], BadItems())
    for item in source_items(config, where=where):
        split.bad.seen += 1
        try:
            record = _preference_pair(item, config) if isinstance(item, PairItem) else _demonstration(item, config)
        except BadItem as bad:
            split.bad.add(bad.kind, item.where, str(bad))
            continue
        held = held_out(item.name, config.split.eval, seed=config.split_seed)
        (split.eval if held else split.train).append(record)
    split.bad.check(config.max_bad_fraction, where=f"{where}.max_bad_fraction")
    if not split.train:
        raise FlowpostError(
            f"split.eval {config.split.eval} holds out every good item; lower it", where=f"{where}.split"
        )
    return split


def _demonstration(item: SourceItem, config: DatasetConfig) -> Demonstration:
    prompt = caption_text(item.caption, max_chars=config.max_caption_chars)
    image = training_image(item.image, config.preprocess, name=item.name)
    key = "item-" + hashlib.sha256(item.name.encode()).hexdigest()[:16]
    return Demonstration(key=key, prompt=prompt, image=image, metadata=item.metadata)


def _preference_pair(item: PairItem, config: DatasetConfig) -> PreferencePair:
    """Both images preprocessed alike (a random crop takes the same offset for both); a bad arm is named."""
    prompt = caption_text(item.caption, max_chars=config.max_caption_chars)
    images = {}
    for arm, source in (("chosen", item.chosen), ("rejected", item.rejected)):
        try:
            images[arm] = training_image(source, config.preprocess, name=item.name)
        except BadItem as bad:
            raise BadItem(bad.kind, f"{arm} image: {bad}") from None
    key = "pair-" + hashlib.sha256(item.name.encode()).hexdigest()[:16]
    return PreferencePair(key=key, prompt=prompt, metadata=item.metadata, **images)
