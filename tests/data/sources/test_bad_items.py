"""Each bad-item kind is counted and skipped; past max_bad_fraction the acquisition fails naming them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from image_samples import make_image_folder, png_bytes
from PIL import Image

from flowpost.core.config.schema import ImageFolderDataset, TableDataset
from flowpost.data.captioned import captioned_split
from flowpost.data.sources.items import BAD_KINDS
from flowpost.errors import FlowpostError
from flowpost.tasks.acquire import acquire_dataset

GRAY = {"preprocess": {"mode": "grayscale"}}


def _lab_tiff() -> bytes:
    buffer = io.BytesIO()
    Image.new("LAB", (8, 8)).save(buffer, format="TIFF")
    return buffer.getvalue()


def _huge_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (200, 200)).save(buffer, format="PNG")  # 0.04 megapixels, over the test's limit of 0.01
    return buffer.getvalue()


def _folder_with_one_bad_item_of_each_kind(root: Path) -> Path:
    make_image_folder(root, 40)
    bad = {
        "unreadable_image": ("truncated.png", png_bytes(3)[:40], {"text": "cut short"}),
        "oversized_image": ("huge.png", _huge_png(), {"text": "more pixels than the limit"}),
        "unconvertible_mode": ("lab.tiff", _lab_tiff(), {"text": "a LAB image"}),  # Pillow has no LAB -> L
        "missing_caption": ("nocaption.png", png_bytes(4), {}),
        "caption_too_long": ("long.png", png_bytes(5), {"text": "x" * 81}),
    }
    lines = []
    for name, data, fields in bad.values():
        (root / name).write_bytes(data)
        lines.append(json.dumps({"file_name": name, **fields}))
    lines.append(json.dumps({"file_name": "gone.png", "text": "a listed file that does not exist"}))
    with (root / "metadata.jsonl").open("a") as handle:
        handle.write("\n".join(lines) + "\n")
    (root / "latin1.png").write_bytes(png_bytes(6))
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    return root


def test_each_kind_is_counted_in_the_manifest_and_skipped(tmp_path: Path) -> None:
    root = _folder_with_one_bad_item_of_each_kind(tmp_path / "folder")
    preprocess = {**GRAY["preprocess"], "max_megapixels": 0.01}
    config = ImageFolderDataset(path=str(root), preprocess=preprocess, max_caption_chars=80, max_bad_fraction=0.2)
    manifest = acquire_dataset(config, tmp_path / "out", where="datasets.pets")
    counts = manifest["bad_items"]["counts"]
    expected = {kind: 0 if "video" in kind else 2 if kind == "unreadable_image" else 1 for kind in BAD_KINDS}
    assert counts == expected
    assert manifest["counts"] == {"train": 40, "eval": 0, "bad": 7}
    assert len(manifest["bad_items"]["first"]) == 5 and manifest["bad_items"]["first"][0].startswith(
        "unreadable_image: "
    )
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk["bad_items"] == manifest["bad_items"]


def test_past_max_bad_fraction_the_node_fails_naming_the_first_items(tmp_path: Path) -> None:
    root = _folder_with_one_bad_item_of_each_kind(tmp_path / "folder")
    config = ImageFolderDataset(path=str(root), **GRAY, max_caption_chars=80)
    out = tmp_path / "out"
    with pytest.raises(FlowpostError, match=r"6 of 47 items are bad.*max_bad_fraction 0.05.*gone.png") as info:
        acquire_dataset(config, out, where="datasets.pets")
    assert info.value.where == "datasets.pets.max_bad_fraction"
    assert not out.exists()  # nothing half-written: shards come only after every item was checked


def test_a_table_with_non_utf8_caption_bytes_and_no_good_item_fails(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["caf\xe9".encode("latin-1")], "image": [png_bytes()]}), table)
    config = TableDataset(path=str(table), max_bad_fraction=1.0)
    with pytest.raises(FlowpostError, match="1 of 1 items are bad.*non_utf8_caption 1"):
        captioned_split(config, where="datasets.t")
