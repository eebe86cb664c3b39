"""Source table: parquet with image bytes (plain or as a datasets struct), csv with relative paths."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from image_samples import png_bytes

from flowpost.core.config.schema import TableDataset
from flowpost.data.captioned import captioned_split
from flowpost.data.sources.registry import source_for
from flowpost.errors import FlowpostError


def _config(path: Path, **fields) -> TableDataset:
    return TableDataset(path=str(path), **fields)


def test_parquet_with_image_bytes_and_structs(tmp_path: Path) -> None:
    table = tmp_path / "items.parquet"
    images = [png_bytes(5), png_bytes(9)]
    rows = {"caption": ["first", "second"], "image": images, "source": ["x", "y"]}
    pq.write_table(pa.table(rows), table)
    split = captioned_split(_config(table), where="datasets.t")
    assert [(r.prompt, r.metadata) for r in split.train] == [
        ("first", {"source": "x"}),
        ("second", {"source": "y"}),
    ]

    structs = [{"bytes": data, "path": None} for data in images]
    pq.write_table(pa.table({"text": ["one", "two"], "img": structs}), table)
    assert len(captioned_split(_config(table, image_column="img"), where="d").train) == 2


def test_csv_with_paths_relative_to_the_table_and_its_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "pics").mkdir()
    for name in ("a", "b"):
        (tmp_path / "pics" / f"{name}.png").write_bytes(png_bytes(ord(name)))
    table = tmp_path / "items.csv"
    table.write_text("image,text\npics/a.png,first\npics/b.png,second\n")
    split = captioned_split(_config(table, preprocess={"resolution": 8, "crop": "random"}), where="d")
    assert [r.prompt for r in split.train] == ["first", "second"] and split.train[0].image.shape == (3, 8, 8)
    before = source_for(_config(table)).fingerprint(where="d")
    (tmp_path / "pics" / "b.png").write_bytes(png_bytes(1))
    assert source_for(_config(table)).fingerprint(where="d") != before  # an image the table names changed


def test_a_missing_image_column_names_the_columns_and_the_setting(tmp_path: Path) -> None:
    table = tmp_path / "items.jsonl"
    table.write_text('{"text": "x", "picture": "a.png"}\n')
    with pytest.raises(FlowpostError, match="no image column 'image' .*picture.*set image_column") as info:
        captioned_split(_config(table), where="datasets.t")
    assert info.value.where == "datasets.t.path"
