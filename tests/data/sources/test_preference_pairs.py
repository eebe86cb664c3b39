"""Source preference-pairs: a parquet of image bytes, a folder of chosen/ and rejected/, bad items, caching."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from image_samples import make_image_folder, png_bytes

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.config.schema import PreferencePairsDataset
from flowpost.core.io import read_json
from flowpost.data.captioned import captioned_split
from flowpost.data.shards import read_pair_shards
from flowpost.data.sources.registry import source_for
from flowpost.errors import FlowpostError
from flowpost.tasks.acquire import acquire_dataset
from flowpost.tasks.runner import SOURCE_FILES, PipelineRun

GRAY = {"preprocess": {"mode": "grayscale", "resolution": 8}}


def _pairs(path: Path, **fields) -> PreferencePairsDataset:
    return PreferencePairsDataset(path=str(path), **{**GRAY, **fields})


def _pair_folder(root: Path, count: int = 6) -> Path:
    """``chosen/`` captioned by a metadata.jsonl and ``rejected/`` with a darker image of each name."""
    make_image_folder(root / "chosen", count, extra={"judge": "person"})
    (root / "rejected").mkdir()
    for i in range(count):
        (root / "rejected" / f"{i:02d}.png").write_bytes(png_bytes(5 * i, mode="L"))
    return root


def test_a_parquet_of_image_bytes_becomes_pair_shards_that_read_back(tmp_path: Path) -> None:
    table = tmp_path / "prefs.parquet"
    chosen = [png_bytes(200, mode="L"), png_bytes(220, mode="L")]
    rejected = [
        {"bytes": png_bytes(value, mode="L"), "path": None} for value in (20, 40)
    ]  # as the datasets library writes
    rows = {"caption": ["a cat", "a dog"], "chosen": chosen, "rejected": rejected, "rater": ["r1", "r2"]}
    pq.write_table(pa.table(rows), table)
    manifest = acquire_dataset(_pairs(table), tmp_path / "out", where="datasets.prefs")
    assert manifest["counts"] == {"train": 2, "eval": 0, "bad": 0}
    train = tmp_path / "out" / "train"
    pairs = read_pair_shards(train, read_json(train / "manifest.json"))
    assert [(p.prompt, p.metadata) for p in pairs] == [("a cat", {"rater": "r1"}), ("a dog", {"rater": "r2"})]
    assert pairs[0].chosen.shape == pairs[0].rejected.shape == (1, 8, 8)
    assert float(pairs[0].chosen.mean()) > float(pairs[0].rejected.mean())  # the arms are not swapped
    assert manifest["train_prompts"] == ["a cat", "a dog"]


def test_a_pair_folder_with_a_held_out_split_and_other_column_names(tmp_path: Path) -> None:
    root = _pair_folder(tmp_path / "pairs", count=20)
    split = captioned_split(_pairs(root, split={"eval": 0.3}), where="datasets.p")
    assert len(split.train) + len(split.eval) == 20 and split.eval and split.train
    assert all(p.metadata["judge"] == "person" for p in split.train)
    table = tmp_path / "renamed.csv"
    (tmp_path / "renamed.csv").write_text("text,good,bad\nx,pairs/chosen/00.png,pairs/rejected/00.png\n")
    renamed = captioned_split(_pairs(table, chosen_column="good", rejected_column="bad"), where="d")
    assert [p.prompt for p in renamed.train] == ["x"]


def test_bad_pairs_are_counted_per_kind_naming_the_arm_and_fail_past_the_threshold(tmp_path: Path) -> None:
    root = _pair_folder(tmp_path / "pairs", count=20)
    (root / "rejected" / "03.png").unlink()  # missing rejected image
    (root / "chosen" / "05.png").write_bytes(png_bytes(1)[:30])  # truncated chosen image
    lines = (root / "chosen" / "metadata.jsonl").read_text().splitlines()
    lines[7] = json.dumps({"file_name": "07.png"})  # no caption
    lines[8] = json.dumps({"file_name": "08.png", "text": "y" * 50})  # too long
    (root / "chosen" / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    (root / "chosen" / "latin.png").write_bytes(png_bytes(9))
    (root / "chosen" / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "rejected" / "latin.png").write_bytes(png_bytes(9))
    config = _pairs(root, max_caption_chars=40, max_bad_fraction=0.3)
    manifest = acquire_dataset(config, tmp_path / "out", where="datasets.p")
    counts = manifest["bad_items"]["counts"]
    assert counts == {
        "unreadable_image": 2,
        "oversized_image": 0,
        "unreadable_video": 0,
        "short_video": 0,
        "unconvertible_mode": 0,
        "missing_caption": 1,
        "non_utf8_caption": 1,
        "caption_too_long": 1,
    }
    assert manifest["counts"] == {"train": 16, "eval": 0, "bad": 5}
    first = " ".join(manifest["bad_items"]["first"])
    assert "03.png: rejected image: the image file does not exist" in first and "05.png: chosen image" in first
    with pytest.raises(FlowpostError, match="5 of 21 items are bad.*max_bad_fraction 0.1") as info:
        acquire_dataset(_pairs(root, max_caption_chars=40, max_bad_fraction=0.1), tmp_path / "again", where="d.p")
    assert info.value.where == "d.p.max_bad_fraction"


def test_missing_rejected_images_are_config_errors_naming_the_setting(tmp_path: Path) -> None:
    table = tmp_path / "prefs.jsonl"
    table.write_text('{"text": "x", "chosen": "a.png", "worse": "b.png"}\n')
    with pytest.raises(FlowpostError, match="no rejected-image column 'rejected'.*worse.*set rejected_column") as info:
        captioned_split(_pairs(table), where="datasets.prefs")
    assert info.value.where == "datasets.prefs.path"
    make_image_folder(tmp_path / "only" / "chosen", 2)
    with pytest.raises(FlowpostError, match="no rejected/ folder"):
        captioned_split(_pairs(tmp_path / "only"), where="datasets.prefs")


def test_the_fingerprint_follows_every_image_a_table_or_folder_names(tmp_path: Path) -> None:
    root = _pair_folder(tmp_path / "pairs")
    before = source_for(_pairs(root)).fingerprint(where="d")
    assert source_for(_pairs(root)).fingerprint(where="d") == before
    (root / "rejected" / "02.png").write_bytes(png_bytes(77))
    assert source_for(_pairs(root)).fingerprint(where="d") != before
    table = tmp_path / "prefs.csv"
    table.write_text("text,chosen,rejected\nx,pairs/chosen/00.png,pairs/rejected/01.png\n")
    named = source_for(_pairs(table)).fingerprint(where="d")
    (root / "rejected" / "01.png").write_bytes(png_bytes(78))
    assert source_for(_pairs(table)).fingerprint(where="d") != named


def test_the_acquisition_is_cached_on_the_same_files_and_reruns_on_a_changed_one(tiny_pipeline, tmp_path) -> None:
    folder = _pair_folder(tmp_path / "pairs")
    config = tiny_pipeline()
    config["datasets"] = {"prefs": {"source": "preference-pairs", "path": str(folder), **GRAY}}
    config["conditions"]["minilm"]["datasets"] = ["prefs"]
    config["stages"]["sft"]["data"]["dataset"] = "prefs"
    del config["evaluate"]
    pipeline = validate_pipeline(config)
    run = PipelineRun(pipeline, tmp_path / "ws")
    assert set(run.inputs["acquire.prefs"]["sources"]) == {SOURCE_FILES}
    first = run.execute("acquire.prefs")
    assert first.status == "ran"
    assert PipelineRun(pipeline, tmp_path / "ws").execute("acquire.prefs").status == "cached"
    shutil.copy(folder / "rejected" / "00.png", folder / "rejected" / "01.png")
    changed = PipelineRun(pipeline, tmp_path / "ws").execute("acquire.prefs")
    assert changed.status == "ran" and changed.fingerprint != first.fingerprint
    shards = [read_json(r.path / "train" / "manifest.json")["shards"] for r in (first, changed)]
    assert shards[0] != shards[1]  # the content moved with the file
    pairs = read_pair_shards(changed.path / "train", read_json(changed.path / "train" / "manifest.json"))
    assert np.array_equal(pairs[0].rejected, pairs[1].rejected)
