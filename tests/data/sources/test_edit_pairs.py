"""Source ``edit-pairs``: a table of instructions, source and target images acquired as target demonstrations under
edit prompts, the sources kept by digest in the dataset's assets."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from image_samples import png_bytes
from PIL import Image

from flowpost.core.config.schema import EditPairsDataset
from flowpost.core.edit_prompts import (
    edit_prompt,
    parse_edit_prompt,
    parse_edit_sources,
    source_count,
    source_digest,
    source_file,
)
from flowpost.core.io import read_json
from flowpost.data.records import EditPair
from flowpost.data.shards import read_shards
from flowpost.errors import FlowpostError
from flowpost.tasks.acquire import acquire_dataset

RGB = {"preprocess": {"mode": "rgb", "resolution": 8}}


def _edits(path: Path, **fields) -> EditPairsDataset:
    return EditPairsDataset(path=str(path), **{**RGB, **fields})


def _table(root: Path, rows: list[dict]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    table = root / "pairs.jsonl"
    table.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return table


def test_edits_become_target_shards_under_edit_prompts_with_their_sources_kept(tmp_path: Path) -> None:
    root = tmp_path / "edits"
    root.mkdir()
    for i, value in enumerate((30, 90, 150)):
        (root / f"s{i}.png").write_bytes(png_bytes(value))
        (root / f"t{i}.png").write_bytes(png_bytes(255 - value))
    rows = [{"instruction": f"edit {i}", "source": f"s{i}.png", "target": f"t{i}.png", "by": "me"} for i in range(3)]
    rows.append({"instruction": "same source again", "source": "s0.png", "target": "t1.png"})
    manifest = acquire_dataset(_edits(_table(root, rows)), tmp_path / "out", where="datasets.edits")
    assert manifest["counts"] == {"train": 4, "eval": 0, "bad": 0}
    records = read_shards(tmp_path / "out" / "train", read_json(tmp_path / "out" / "train" / "manifest.json"))
    parsed = {record.key: parse_edit_prompt(record.prompt) for record in records}
    assert sorted(instruction for instruction, _ in parsed.values()) == [
        *(f"edit {i}" for i in range(3)),
        "same source again",
    ]
    assets = tmp_path / "out" / "assets"
    assert len(list((assets / "sources").iterdir())) == 3  # one file per distinct source
    for record in records:
        instruction, digest = parse_edit_prompt(record.prompt)
        path = source_file(assets, digest)
        assert source_digest(path.read_bytes()) == digest and record.metadata["instruction"] == instruction
        assert record.metadata["source_image"] == f"sources/{digest}.png"
        source = np.asarray(Image.open(io.BytesIO(path.read_bytes())), dtype=np.float32) / 255
        assert source.shape == (8, 8, 3) and record.image.shape == (3, 8, 8)
        assert not np.allclose(source.transpose(2, 0, 1), record.image, atol=0.1)  # the target, not the source
    first = next(r for r in records if r.metadata.get("by") == "me" and r.metadata["instruction"] == "edit 0")
    again = next(r for r in records if r.metadata["instruction"] == "same source again")
    assert parse_edit_prompt(first.prompt)[1] == parse_edit_prompt(again.prompt)[1]
    assert set(manifest["train_prompts"]) == {r.prompt for r in records}


def test_bad_edits_are_counted_naming_the_image(tmp_path: Path) -> None:
    root = tmp_path / "edits"
    root.mkdir()
    (root / "s.png").write_bytes(png_bytes(10))
    rows = [{"instruction": "fine", "source": "s.png", "target": "s.png"}]
    rows.append({"instruction": "no target", "source": "s.png", "target": "gone.png"})
    rows.append({"source": "s.png", "target": "s.png"})
    manifest = acquire_dataset(_edits(_table(root, rows), max_bad_fraction=0.9), tmp_path / "out", where="d.e")
    assert manifest["counts"] == {"train": 1, "eval": 0, "bad": 2}
    assert (
        manifest["bad_items"]["counts"]["unreadable_image"] == 1
        and manifest["bad_items"]["counts"]["missing_caption"] == 1
    )
    assert "target image: the image file does not exist" in " ".join(manifest["bad_items"]["first"])


def test_a_table_without_the_target_column_is_refused_naming_the_setting(tmp_path: Path) -> None:
    table = _table(tmp_path, [{"instruction": "x", "source": "a.png", "after": "b.png"}])
    with pytest.raises(FlowpostError, match="no target-image column 'target'.*after.*set target_column") as info:
        acquire_dataset(_edits(table), tmp_path / "out", where="datasets.edits")
    assert info.value.where == "datasets.edits.path"


def test_edit_prompts_round_trip_and_records_check_their_images() -> None:
    prompt = edit_prompt("make it [red]", "0123456789abcdef")
    assert parse_edit_prompt(prompt) == ("make it [red]", "0123456789abcdef")
    assert parse_edit_prompt("a red cat") is None and parse_edit_prompt("x [source 0123]") is None
    with pytest.raises(ValueError, match="16 lowercase hex"):
        edit_prompt("x", "ABC")
    image = np.zeros((3, 4, 4), np.float32)
    with pytest.raises(ValueError, match="source .* and target .* differ in shape"):
        EditPair(key="e", instruction="x", source=image, target=np.zeros((3, 8, 8), np.float32))


def test_edits_with_several_sources_keep_each_in_order_under_one_prompt(tmp_path: Path) -> None:
    root = tmp_path / "edits"
    root.mkdir()
    for name, value in (("a", 30), ("b", 90), ("t", 200)):
        (root / f"{name}.png").write_bytes(png_bytes(value))
    rows = [{"instruction": "put a on b", "source": "a.png", "second": "b.png", "target": "t.png"}]
    dataset = _edits(_table(root, rows), more_source_columns=["second"])
    acquire_dataset(dataset, tmp_path / "out", where="datasets.edits")
    [record] = read_shards(tmp_path / "out" / "train", read_json(tmp_path / "out" / "train" / "manifest.json"))
    instruction, digests = parse_edit_sources(record.prompt)
    assets = tmp_path / "out" / "assets"
    assert instruction == "put a on b" and len(digests) == 2 and parse_edit_prompt(record.prompt)[1] == digests[0]
    assert record.metadata["source_images"] == [f"sources/{digest}.png" for digest in digests]
    for digest, value in zip(digests, (30, 90), strict=True):  # each source's own file, in the table's order
        stored = np.asarray(Image.open(source_file(assets, digest)), dtype=np.float32)
        assert stored.shape == (8, 8, 3) and abs(float(stored[..., 0].mean()) - value) < 2  # red: the value
    with pytest.raises(FlowpostError, match="no source-image column 'third'.*fix more_source_columns"):
        acquire_dataset(_edits(_table(root, rows), more_source_columns=["third"]), tmp_path / "again", where="d")
    image = np.zeros((3, 4, 4), np.float32)
    with pytest.raises(ValueError, match="source 2 .* and target .* differ in shape"):
        EditPair(key="e", instruction="x", source=image, target=image, more_sources=(np.zeros((3, 8, 8), np.float32),))


def test_a_condition_cache_holds_edits_of_one_number_of_sources() -> None:
    one, two = edit_prompt("x", "0" * 16), edit_prompt("y", "0" * 16, "1" * 16)
    assert source_count(["", one]) == 1 and source_count([two, ""]) == 2 and source_count(["a cat"]) == 1
    with pytest.raises(ValueError, match=r"different numbers of source images \(\[1, 2\]\)"):
        source_count([one, two])
