"""Node ``acquire.<dataset>``: the dataset source its ``source`` names acquires it; the built-in ones, a prompt set
or captioned media, are here."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flowpost.core.config.schema import captioned
from flowpost.core.config.schema.dataset_base import StoredDataset
from flowpost.core.config.schema.datasets import PromptFilesDataset
from flowpost.core.datasets import DATASET_REGISTRY, DatasetSource
from flowpost.core.io import sha256_file, write_bytes_atomic, write_json_atomic
from flowpost.core.logging import get_logger
from flowpost.data.bad_items import BadItems
from flowpost.data.captioned import captioned_records, check_captioned
from flowpost.data.edit_pairs import stored_edit
from flowpost.data.item_progress import item_progress
from flowpost.data.preprocess import decoding_record
from flowpost.data.prompt_files import prompt_files_fingerprint, read_prompt_files
from flowpost.data.records import EditPair
from flowpost.data.shards import SHARD_SIZE, ShardWriter
from flowpost.data.sources.registry import source_for
from flowpost.data.stage_inputs import PROMPTS_FILE

log = get_logger(__name__)
ASSETS = "assets"  # what an edit dataset keeps beside its shards: the source images


def acquire_dataset(
    config: StoredDataset, out_dir: Path, *, smoke: bool = False, where: str = "datasets"
) -> dict[str, Any]:
    """Acquire one dataset into ``out_dir`` with the source its ``source`` names, and return its manifest (also
    written as ``manifest.json``)."""
    source: DatasetSource = DATASET_REGISTRY.load(config.source, where=f"{where}.source")(config)
    return source.acquire(out_dir, smoke=smoke, where=where)


class PromptFilesSource(DatasetSource):
    """``prompt-files``: a prompt set (``acquire_prompt_files``)."""

    model = PromptFilesDataset
    config: PromptFilesDataset

    def acquire(self, out_dir: Path, *, smoke: bool, where: str) -> dict[str, Any]:
        """Copy the prompts and write the manifest."""
        return acquire_prompt_files(self.config, out_dir, where=where)


class CaptionedMediaSource(DatasetSource):
    """A source of captioned media, read by its reader (``data/sources``) into shards (``acquire_images``)."""

    config: captioned.CaptionedDataset

    def acquire(self, out_dir: Path, *, smoke: bool, where: str) -> dict[str, Any]:
        """Stream the items into shards and write the manifest."""
        return acquire_images(self.config, out_dir, where=where)


class ImageFolderSource(CaptionedMediaSource):
    """``image-folder``."""

    model = captioned.ImageFolderDataset


class TableSource(CaptionedMediaSource):
    """``table``."""

    model = captioned.TableDataset


class VideoFolderSource(CaptionedMediaSource):
    """``video-folder``."""

    model = captioned.VideoFolderDataset


class PreferencePairsSource(CaptionedMediaSource):
    """``preference-pairs``."""

    model = captioned.PreferencePairsDataset


class EditPairsSource(CaptionedMediaSource):
    """``edit-pairs``: the targets in shards, the sources in ``assets/sources/``."""

    model = captioned.EditPairsDataset


class WebShardsSource(CaptionedMediaSource):
    """``webdataset``."""

    model = captioned.WebShardsDataset


class HfDatasetSource(CaptionedMediaSource):
    """``hf-dataset``."""

    model = captioned.HfDataset


def acquire_prompt_files(config: PromptFilesDataset, out_dir: Path, *, where: str) -> dict[str, Any]:
    """Copy the prompts (with their metadata) to ``prompts.jsonl`` and list them in the manifest."""
    records, removed, _ = read_prompt_files(config.path, where=f"{where}.path")
    if removed:
        log.warning("removed %d control characters from the prompts of %s", removed, config.path)
    lines = [json.dumps({"prompt": r.prompt, "metadata": r.metadata}, sort_keys=True) for r in records]
    write_bytes_atomic(out_dir / PROMPTS_FILE, ("\n".join(lines) + "\n").encode("utf-8"))
    manifest = {
        "source": config.source,
        "path": config.path,
        "files_fingerprint": prompt_files_fingerprint(config.path, where=f"{where}.path"),
        "counts": {"prompts": len(records), "control_characters_removed": removed},
        "sha256": sha256_file(out_dir / PROMPTS_FILE),
        "train_prompts": [r.prompt for r in records],
        "eval_prompts": [],
    }
    write_json_atomic(out_dir / "manifest.json", manifest)
    log.info("acquired %d prompts from %s", len(records), config.path)
    return manifest


def acquire_images(
    config: captioned.CaptionedDataset, out_dir: Path, *, where: str, shard_size: int = SHARD_SIZE
) -> dict[str, Any]:
    """Write ``train/`` (and ``eval/``, the held-out split) shards of the good items and ``manifest.json``,
    which counts the bad ones per kind.

    Items are decoded one at a time straight into their split's shards, so memory holds one shard per
    split, not the source; ``manifest.json`` is written only once every item was read and the bad ones
    stayed within ``max_bad_fraction``; a failure removes the shards written so far.
    """
    bad, source = BadItems(), source_for(config)
    writers = {name: ShardWriter(out_dir / name, shard_size=shard_size) for name in ("train", "eval")}
    with _removed_on_failure(out_dir, [*writers, ASSETS]):
        records = captioned_records(config, bad, where=where)
        for name, record in item_progress(records, desc=f"acquire {source.location()}"):
            writers[name].add(stored_edit(record, out_dir / ASSETS) if isinstance(record, EditPair) else record)
        check_captioned(config, bad, trained=writers["train"].count, where=where)
        shards = {name: writer.close() for name, writer in writers.items() if writer.count}
        for name, manifest in shards.items():
            write_json_atomic(out_dir / name / "manifest.json", manifest)
        held_out_prompts = shards["eval"]["prompts"] if "eval" in shards else []
        trained = set(shards["train"]["prompts"])
        manifest = {
            "source": config.source,
            "path": source.location(),
            "files_fingerprint": source.fingerprint(where=where),
            "preprocess": config.preprocess.model_dump(mode="json"),
            "decoding": decoding_record(config.preprocess),
            "counts": {name: writer.count for name, writer in writers.items()} | {"bad": bad.total},
            "bad_items": bad.manifest(),
            "shards": {name: m["shards"] for name, m in shards.items()},
            "train_prompts": shards["train"]["prompts"],
            "eval_prompts": [{"prompt": p} for p in held_out_prompts if p not in trained],
        }
        write_json_atomic(out_dir / "manifest.json", manifest)
    log.info("acquired %s: %s", manifest["path"], manifest["counts"])
    return manifest


@contextmanager
def _removed_on_failure(out_dir: Path, parts: list[str]) -> Iterator[None]:
    """Remove ``out_dir``'s ``parts`` (and ``out_dir`` itself when it did not exist) if the body raises."""
    existed = out_dir.exists()
    try:
        yield
    except BaseException:
        for part in parts:
            shutil.rmtree(out_dir / part, ignore_errors=True)
        if not existed:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
