"""Node ``acquire.<dataset>``: digits shards, manifest and evaluator classifiers, a prompt set, or captioned media."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from flowpost.core.config.schema.captioned import CaptionedDataset
from flowpost.core.config.schema.datasets import DigitsDataset, PromptFilesDataset
from flowpost.core.evaluation.classifier import (
    JUDGE_CLASSIFIER,
    REWARD_CLASSIFIER,
    accuracy,
    save_classifier,
    train_classifier,
)
from flowpost.core.io import sha256_file, write_bytes_atomic, write_json_atomic
from flowpost.core.logging import get_logger
from flowpost.data.bad_items import BadItems
from flowpost.data.captioned import captioned_records, check_captioned
from flowpost.data.digits import (
    EVAL_TEMPLATES,
    TRAIN_TEMPLATES,
    caption,
    demonstrations,
    load_digits_split,
)
from flowpost.data.item_progress import item_progress
from flowpost.data.preprocess import decoding_record
from flowpost.data.prompt_files import prompt_files_fingerprint, read_prompt_files
from flowpost.data.shards import SHARD_SIZE, ShardWriter, write_shards
from flowpost.data.sources.registry import source_for
from flowpost.data.stage_inputs import PROMPTS_FILE

log = get_logger(__name__)
MIN_ACCURACY = 0.97


def acquire_dataset(
    config: DigitsDataset | PromptFilesDataset | CaptionedDataset,
    out_dir: Path,
    *,
    smoke: bool = False,
    where: str = "datasets",
) -> dict[str, Any]:
    """Acquire one dataset into ``out_dir`` and return its manifest (also written as ``manifest.json``)."""
    if isinstance(config, PromptFilesDataset):
        return acquire_prompt_files(config, out_dir, where=where)
    if isinstance(config, CaptionedDataset):
        return acquire_images(config, out_dir, where=where)
    return acquire_digits(config, out_dir, smoke=smoke)


def acquire_prompt_files(config: PromptFilesDataset, out_dir: Path, *, where: str) -> dict[str, Any]:
    """Copy the prompts (with their metadata) to ``prompts.jsonl`` and list them in the manifest."""
    records, removed = read_prompt_files(config.path, where=f"{where}.path")
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
        "classifiers": {},
    }
    write_json_atomic(out_dir / "manifest.json", manifest)
    log.info("acquired %d prompts from %s", len(records), config.path)
    return manifest


def acquire_images(
    config: CaptionedDataset, out_dir: Path, *, where: str, shard_size: int = SHARD_SIZE
) -> dict[str, Any]:
    """Write ``train/`` (and ``eval/``, the held-out split) shards of the good items and ``manifest.json``,
    which counts the bad ones per kind.

    Items are decoded one at a time straight into their split's shards, so memory holds one shard per
    split, not the source; ``manifest.json`` is written only once every item was read and the bad ones
    stayed within ``max_bad_fraction``; a failure removes the shards written so far.
    """
    bad, source = BadItems(), source_for(config)
    writers = {name: ShardWriter(out_dir / name, shard_size=shard_size) for name in ("train", "eval")}
    with _removed_on_failure(out_dir, list(writers)):
        records = captioned_records(config, bad, where=where)
        for name, record in item_progress(records, desc=f"acquire {source.location()}"):
            writers[name].add(record)
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
            "classifiers": {},
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


def acquire_digits(config: DigitsDataset, out_dir: Path, *, smoke: bool = False) -> dict[str, Any]:
    """Write ``train/`` and ``test/`` shards, ``assets/`` classifiers and ``manifest.json``.

    Train records pair each train image with every training template; test records pair each
    held-out image with every held-out template (evaluation only).
    """
    split = load_digits_split(
        image_size=config.image_size,
        test_fraction=config.test_fraction,
        split_seed=config.split_seed,
    )
    shards = {
        "train": write_shards(
            demonstrations(split.train_images, split.train_labels, TRAIN_TEMPLATES, prefix="train"),
            out_dir / "train",
        ),
        "test": write_shards(
            demonstrations(split.test_images, split.test_labels, EVAL_TEMPLATES, prefix="test"),
            out_dir / "test",
        ),
    }
    for name, manifest in shards.items():
        write_json_atomic(out_dir / name / "manifest.json", manifest)

    train_x, train_y = torch.from_numpy(split.train_images), torch.from_numpy(split.train_labels)
    test_x, test_y = torch.from_numpy(split.test_images), torch.from_numpy(split.test_labels)
    classifiers = {}
    for spec in (REWARD_CLASSIFIER, JUDGE_CLASSIFIER):
        model = train_classifier(train_x, train_y, width=spec.width, seed=spec.seed, epochs=3 if smoke else 30)
        held_out = accuracy(model, test_x, test_y)
        if not smoke and held_out < MIN_ACCURACY:
            raise RuntimeError(f"classifier {spec.name} reached {held_out:.4f} < {MIN_ACCURACY} held-out accuracy")
        save_classifier(model, out_dir / "assets", spec.name)
        classifiers[spec.name] = {
            "role": "reward" if spec is REWARD_CLASSIFIER else "judge",
            "accuracy": held_out,
        }
        log.info("classifier %s: held-out accuracy %.4f", spec.name, held_out)

    manifest = {
        "source": config.source,
        "image_size": config.image_size,
        "counts": {name: m["count"] for name, m in shards.items()},
        "shards": {name: m["shards"] for name, m in shards.items()},
        "train_prompts": shards["train"]["prompts"],
        "eval_prompts": [
            {"prompt": caption(template, label), "label": label} for template in EVAL_TEMPLATES for label in range(10)
        ],
        "classifiers": classifiers,
        "smoke": smoke,
    }
    write_json_atomic(out_dir / "manifest.json", manifest)
    return manifest
