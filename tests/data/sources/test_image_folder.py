"""Source image-folder: metadata.jsonl / metadata.csv, sidecar .txt, nested folders, extra columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from image_samples import png_bytes

from flowpost.core.config.schema import ImageFolderDataset
from flowpost.data.captioned import captioned_split
from flowpost.data.sources.registry import source_for
from flowpost.errors import FlowpostError


def _config(root: Path, **fields) -> ImageFolderDataset:
    return ImageFolderDataset(path=str(root), **fields)


def test_metadata_jsonl_captions_and_extra_columns(image_folder) -> None:
    root = image_folder(4, extra={"style": "flat"})
    split = captioned_split(_config(root, preprocess={"resolution": 8}), where="datasets.pets")
    assert [r.prompt for r in split.train] == [f"a square of shade {i}" for i in range(4)]
    assert split.train[0].metadata == {"file_name": "00.png", "style": "flat"}
    assert split.train[0].image.shape == (3, 8, 8) and split.train[0].image.dtype == np.float32
    assert split.bad.total == 0 and split.eval == []


def test_metadata_csv_with_a_configured_caption_column_in_a_nested_folder(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "x.png").write_bytes(png_bytes(30))
    (root / "a" / "metadata.csv").write_text("file_name,words,score\nb/x.png,a nested square,3\n")
    split = captioned_split(_config(root, caption_column="words"), where="datasets.pets")
    assert [(r.prompt, r.metadata) for r in split.train] == [
        ("a nested square", {"file_name": "a/b/x.png", "score": "3"})
    ]


def test_sidecar_txt_and_caption_fallback_to_the_caption_column(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "one.png").write_bytes(png_bytes(1))
    (root / "sub" / "one.txt").write_text("  a sidecar caption\n")
    (root / "two.png").write_bytes(png_bytes(2))
    (root / "metadata.jsonl").write_text('{"file_name": "two.png", "caption": "from the caption column"}\n')
    split = captioned_split(_config(root, preprocess={"mode": "grayscale"}), where="datasets.pets")
    assert sorted(r.prompt for r in split.train) == ["a sidecar caption", "from the caption column"]
    assert split.train[0].image.shape == (1, 16, 16)


def test_held_out_split_is_deterministic_by_item_and_disjoint(image_folder) -> None:
    root = image_folder(40)
    config = _config(root, split={"eval": 0.25})
    first, second = captioned_split(config, where="d"), captioned_split(config, where="d")
    assert [r.key for r in first.eval] == [r.key for r in second.eval] and 0 < len(first.eval) < 40
    assert not {r.prompt for r in first.eval} & {r.prompt for r in first.train}
    (root / "39.png").unlink()  # removing an item moves no other item between splits
    fewer = captioned_split(config, where="d")
    assert {r.key for r in fewer.eval} <= {r.key for r in first.eval}


def test_fingerprint_follows_every_file_and_a_missing_folder_is_named(image_folder, tmp_path: Path) -> None:
    root = image_folder(3)
    before = source_for(_config(root)).fingerprint(where="datasets.pets")
    assert source_for(_config(root)).fingerprint(where="datasets.pets") == before
    (root / "01.png").write_bytes(png_bytes(99))
    assert source_for(_config(root)).fingerprint(where="datasets.pets") != before
    with pytest.raises(FlowpostError, match="does not exist") as info:
        source_for(_config(tmp_path / "nowhere")).fingerprint(where="datasets.pets")
    assert info.value.where == "datasets.pets.path"
