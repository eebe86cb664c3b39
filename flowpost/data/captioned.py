"""Captioned-media sources (``image-folder``, ``table``, ``webdataset``, ``hf-dataset``, ``video-folder``,
``preference-pairs``) as train and held-out demonstrations or preference pairs."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flowpost.core.config.schema import DatasetConfig
from flowpost.data.bad_items import BadItems
from flowpost.data.clips import training_clip
from flowpost.data.preprocess import training_image
from flowpost.data.records import Demonstration, PreferencePair
from flowpost.data.sources.hf_dataset import hf_items, hub_fingerprint, saved_fingerprint
from flowpost.data.sources.image_folder import folder_fingerprint, folder_items
from flowpost.data.sources.items import BadItem, SourceItem, caption_text
from flowpost.data.sources.preference_pairs import PairItem, pair_items, pairs_fingerprint
from flowpost.data.sources.table import table_fingerprint, table_items
from flowpost.data.sources.video_folder import video_items
from flowpost.data.sources.web_shards import shard_dependencies, shard_items, shard_urls, shards_fingerprint
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
    """Hash of what a captioned source reads: any change to one of its files reruns its acquisition."""
    if config.source == "webdataset":
        assert config.shards is not None
        return shards_fingerprint(shard_urls(config.shards, where=f"{where}.shards"), where=f"{where}.shards")
    if config.source == "hf-dataset" and config.hub is not None:
        return hub_fingerprint(config.hub, where=f"{where}.hub")
    assert config.path is not None
    path, at = Path(config.path), f"{where}.path"
    outside = config.allow_outside
    if config.source == PAIRS:
        columns = {"chosen_column": config.chosen_column, "rejected_column": config.rejected_column}
        return pairs_fingerprint(path, **columns, where=at, allow_outside=outside)
    if config.source == "table":
        return table_fingerprint(path, image_columns=(config.image_column,), where=at, allow_outside=outside)
    if config.source == "hf-dataset":
        return saved_fingerprint(path, where=at)
    return folder_fingerprint(path, where=at, allow_outside=outside)


def source_location(config: DatasetConfig) -> str:
    """Where a captioned source reads from, for manifests and logs."""
    if config.hub is not None:
        return f"hub:{config.hub.id}"
    if config.shards is not None:
        return config.shards if isinstance(config.shards, str) else ", ".join(config.shards)
    return str(config.path)


def source_dependencies(config: DatasetConfig, *, where: str) -> list[str]:
    """The files and folders any source reads, as DVC dependencies (a hub dataset has none: params pin it)."""
    if config.source == "webdataset":
        assert config.shards is not None
        return shard_dependencies(shard_urls(config.shards, where=f"{where}.shards"))
    return [config.path] if config.path is not None else []


def source_items(config: DatasetConfig, *, where: str) -> Iterator[SourceItem | PairItem]:
    captions = config.caption_column
    if config.source == "webdataset":
        assert config.shards is not None
        urls = shard_urls(config.shards, where=f"{where}.shards")
        keys = {"image_keys": config.image_keys, "caption_keys": config.caption_keys}
        return shard_items(urls, **keys, caption_column=captions, where=f"{where}.shards")
    if config.source == "hf-dataset":
        path = Path(config.path) if config.path is not None else None
        columns = {"caption_column": captions, "image_column": config.image_column}
        return hf_items(path=path, hub=config.hub, **columns, where=where)
    assert config.path is not None
    path, at = Path(config.path), f"{where}.path"
    outside = config.allow_outside
    if config.source == PAIRS:
        columns = {"chosen_column": config.chosen_column, "rejected_column": config.rejected_column}
        return pair_items(path, caption_column=captions, **columns, where=at, allow_outside=outside)
    if config.source == "table":
        columns = {"caption_column": captions, "image_column": config.image_column}
        return table_items(path, **columns, where=at, allow_outside=outside)
    if config.source == "video-folder":
        return video_items(path, caption_column=captions, where=at, allow_outside=outside)
    return folder_items(path, caption_column=captions, where=at, allow_outside=outside)


def captioned_records(config: DatasetConfig, bad: BadItems, *, where: str) -> Iterator[tuple[str, Record]]:
    """Each good item's split (``train`` or ``eval``) and record, decoded one at a time as the items are
    read; the bad ones are counted and named in ``bad`` (see ``check_captioned``)."""
    for item in source_items(config, where=where):
        bad.seen += 1
        try:
            record = _preference_pair(item, config) if isinstance(item, PairItem) else _demonstration(item, config)
        except BadItem as skipped:
            bad.add(skipped.kind, item.where, str(skipped))
            continue
        yield ("eval" if held_out(item.name, config.split.eval, seed=config.split_seed) else "train"), record


def check_captioned(config: DatasetConfig, bad: BadItems, *, trained: int, where: str) -> None:
    """Raise past ``max_bad_fraction`` of all the items read, or when the split left none to train on."""
    bad.check(config.max_bad_fraction, where=f"{where}.max_bad_fraction")
    if not trained:
        raise FlowpostError(
            f"split.eval {config.split.eval} holds out every good item; lower it", where=f"{where}.split"
        )


def captioned_split(config: DatasetConfig, *, where: str) -> CaptionedSplit:
    """Every good item as a demonstration (or pair) in its split; a FlowpostError past ``max_bad_fraction``."""
    split = CaptionedSplit([], [], BadItems())
    for name, record in captioned_records(config, split.bad, where=where):
        split.splits()[name].append(record)
    check_captioned(config, split.bad, trained=len(split.train), where=where)
    return split


def _demonstration(item: SourceItem, config: DatasetConfig) -> Demonstration:
    prompt = caption_text(item.caption, max_chars=config.max_caption_chars)
    key = "item-" + hashlib.sha256(item.name.encode()).hexdigest()[:16]
    return Demonstration(key=key, prompt=prompt, image=_media(item, config), metadata=item.metadata)


def _media(item: SourceItem, config: DatasetConfig) -> np.ndarray:
    """The item's training image [C, H, W], or its clip [C, T, H, W] for a video source."""
    if config.source == "video-folder":
        assert isinstance(item.image, Path)
        return training_clip(item.image, config.frames, config.preprocess, name=item.name)
    return training_image(item.image, config.preprocess, name=item.name)


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
