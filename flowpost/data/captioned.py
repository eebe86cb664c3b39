"""Captioned-media sources (``image-folder``, ``table``, ``webdataset``, ``hf-dataset``, ``video-folder``,
``preference-pairs``, ``edit-pairs``) as train and held-out demonstrations, preference pairs or edits."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flowpost.core.config.schema.captioned import CaptionedDataset, VideoFolderDataset
from flowpost.core.config.schema.datasets import DatasetConfig, PromptFilesDataset
from flowpost.data.bad_items import BadItems
from flowpost.data.clips import training_clip
from flowpost.data.preprocess import training_image
from flowpost.data.records import Demonstration, EditPair, PreferencePair
from flowpost.data.sources.items import BadItem, EditItem, PairItem, SourceItem, caption_text
from flowpost.data.sources.registry import source_for
from flowpost.data.splits import held_out
from flowpost.errors import FlowpostError

Record = Demonstration | PreferencePair | EditPair


@dataclass
class CaptionedSplit:
    """The demonstrations (or, for ``preference-pairs``, the pairs) of each split and the items skipped as bad."""

    train: list[Record]
    eval: list[Record]
    bad: BadItems

    def splits(self) -> dict[str, list[Record]]:
        return {"train": self.train, "eval": self.eval}


def source_dependencies(config: DatasetConfig, *, where: str) -> list[str]:
    """The files and folders a dataset reads, as DVC dependencies (a hub dataset has none: params pin it; nor
    has one that is built in or sampled)."""
    if isinstance(config, CaptionedDataset):
        return source_for(config).dependencies(where=where)
    return [config.path] if isinstance(config, PromptFilesDataset) else []


def captioned_records(config: CaptionedDataset, bad: BadItems, *, where: str) -> Iterator[tuple[str, Record]]:
    """Each good item's split (``train`` or ``eval``) and record, decoded one at a time as the items are
    read; the bad ones are counted and named in ``bad`` (see ``check_captioned``)."""
    for item in source_for(config).items(where=where):
        bad.seen += 1
        try:
            if isinstance(item, PairItem):
                record: Record = _preference_pair(item, config)
            elif isinstance(item, EditItem):
                record = _edit_pair(item, config)
            else:
                record = _demonstration(item, config)
        except BadItem as skipped:
            bad.add(skipped.kind, item.where, str(skipped))
            continue
        yield ("eval" if held_out(item.name, config.split.eval, seed=config.split_seed) else "train"), record


def check_captioned(config: CaptionedDataset, bad: BadItems, *, trained: int, where: str) -> None:
    """Raise past ``max_bad_fraction`` of all the items read, or when the split left none to train on."""
    bad.check(config.max_bad_fraction, where=f"{where}.max_bad_fraction")
    if not trained:
        raise FlowpostError(
            f"split.eval {config.split.eval} holds out every good item; lower it", where=f"{where}.split"
        )


def captioned_split(config: CaptionedDataset, *, where: str) -> CaptionedSplit:
    """Every good item as a demonstration (or pair) in its split; a FlowpostError past ``max_bad_fraction``."""
    split = CaptionedSplit([], [], BadItems())
    for name, record in captioned_records(config, split.bad, where=where):
        split.splits()[name].append(record)
    check_captioned(config, split.bad, trained=len(split.train), where=where)
    return split


def _demonstration(item: SourceItem, config: CaptionedDataset) -> Demonstration:
    prompt = caption_text(item.caption, max_chars=config.max_caption_chars)
    key = "item-" + hashlib.sha256(item.name.encode()).hexdigest()[:16]
    return Demonstration(key=key, prompt=prompt, image=_media(item, config), metadata=item.metadata)


def _media(item: SourceItem, config: CaptionedDataset) -> np.ndarray:
    """The item's training image [C, H, W], or its clip [C, T, H, W] for a video source."""
    if isinstance(config, VideoFolderDataset):
        assert isinstance(item.image, Path)
        return training_clip(item.image, config.frames, config.preprocess, name=item.name)
    return training_image(item.image, config.preprocess, name=item.name)


def _preference_pair(item: PairItem, config: CaptionedDataset) -> PreferencePair:
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


def _edit_pair(item: EditItem, config: CaptionedDataset) -> EditPair:
    """Sources and target preprocessed alike (a random crop takes the same offset for each); a bad one is named."""
    instruction = caption_text(item.caption, max_chars=config.max_caption_chars)
    parts = [("source", item.source), ("target", item.target)]
    parts += [(f"source {number}", image) for number, image in enumerate(item.more_sources, start=2)]
    images = {}
    for part, image in parts:
        try:
            images[part] = training_image(image, config.preprocess, name=item.name)
        except BadItem as bad:
            raise BadItem(bad.kind, f"{part} image: {bad}") from None
    key = "edit-" + hashlib.sha256(item.name.encode()).hexdigest()[:16]
    more = tuple(images.pop(part) for part, _ in parts[2:])
    return EditPair(key=key, instruction=instruction, metadata=item.metadata, more_sources=more, **images)
