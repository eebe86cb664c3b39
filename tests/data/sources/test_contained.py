"""A dataset folder is closed: no absolute path, ``..`` or symlink reads outside it unless allowed, and what
an allowed one reads is in the fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from image_samples import make_image_folder, png_bytes

from flowpost.core.config.schema import CaptionedDataset, PromptFilesDataset, dataset_config
from flowpost.data.sources.registry import source_for
from flowpost.errors import FlowpostError

WHERE = "datasets.pets"


def _config(root: Path, source: str = "image-folder", **fields) -> CaptionedDataset:
    config = dataset_config({"source": source, "path": str(root), **fields})
    assert isinstance(config, CaptionedDataset)
    return config


def _items(config: CaptionedDataset) -> list:
    return list(source_for(config).items(where=WHERE))


def _outside(tmp_path: Path) -> Path:
    secret = tmp_path / "elsewhere" / "x.png"
    secret.parent.mkdir()
    secret.write_bytes(png_bytes(7))
    return secret


def _named(root: Path, file_name: str) -> None:
    with (root / "metadata.jsonl").open("a") as handle:
        handle.write(json.dumps({"file_name": file_name, "text": "from elsewhere"}) + "\n")


@pytest.mark.parametrize("kind", ["dotdot", "absolute"])
def test_a_metadata_row_naming_a_file_outside_is_refused_naming_its_line(tmp_path: Path, kind: str) -> None:
    root = make_image_folder(tmp_path / "folder", 3)
    secret = _outside(tmp_path)
    _named(root, "../elsewhere/x.png" if kind == "dotdot" else str(secret))
    for read in (_items, lambda config: source_for(config).fingerprint(where=WHERE)):
        with pytest.raises(FlowpostError) as refused:
            read(_config(root))
        assert refused.value.where == f"{root / 'metadata.jsonl'}:4"
        assert "allow_outside: true" in str(refused.value)


def test_a_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "folder", 3)
    (root / "linked.png").symlink_to(_outside(tmp_path))
    with pytest.raises(FlowpostError, match=r"linked\.png leads outside .* \(to .*elsewhere/x\.png\)") as refused:
        source_for(_config(root)).fingerprint(where=WHERE)
    assert refused.value.where == f"{WHERE}.path"


def test_a_symlink_inside_the_folder_is_read(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "folder", 3)
    (root / "again.png").symlink_to(root / sorted(p.name for p in root.glob("*.png"))[0])
    assert len(_items(_config(root))) == 4


def test_allowed_outside_files_are_read_and_fingerprinted(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "folder", 3)
    secret = _outside(tmp_path)
    _named(root, "../elsewhere/x.png")
    (root / "linked.png").symlink_to(secret)
    config = _config(root, allow_outside=True)
    names = [item.name for item in _items(config)]
    assert "../elsewhere/x.png" in names and "linked.png" in names
    before = source_for(config).fingerprint(where=WHERE)
    secret.write_bytes(png_bytes(8))  # the outside file changes: the acquisition must rerun
    assert source_for(config).fingerprint(where=WHERE) != before


def test_a_table_cell_naming_a_file_outside_is_refused(tmp_path: Path) -> None:
    _outside(tmp_path)
    table = tmp_path / "data" / "table.jsonl"
    table.parent.mkdir()
    table.write_text(json.dumps({"image": "../elsewhere/x.png", "text": "a cat"}) + "\n")
    config = _config(table, source="table")
    with pytest.raises(FlowpostError, match="leads outside") as refused:
        source_for(config).fingerprint(where=WHERE)
    assert refused.value.where == f"{table}:1"
    assert len(_items(_config(table, source="table", allow_outside=True))) == 1


def test_a_pair_folder_whose_rejected_image_links_out_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "pairs"
    make_image_folder(root / "chosen", 2)
    (root / "rejected").mkdir()
    names = sorted(p.name for p in (root / "chosen").glob("*.png"))
    (root / "rejected" / names[0]).write_bytes(png_bytes(1))
    (root / "rejected" / names[1]).symlink_to(_outside(tmp_path))
    with pytest.raises(FlowpostError, match="leads outside"):
        _items(_config(root, source="preference-pairs"))


def test_the_option_applies_only_to_sources_that_read_paths() -> None:
    with pytest.raises(ValueError, match="allow_outside do not apply to source 'prompt-files'"):
        PromptFilesDataset(path="p.txt", allow_outside=True)


def test_a_symlinked_folder_is_read_once_and_a_cycle_ends(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "folder", 3)
    (root / "again").symlink_to(root, target_is_directory=True)  # a cycle back to the folder itself
    names = sorted(item.name for item in _items(_config(root)))
    assert len(names) == 3 and not any(name.startswith("again/") for name in names)


def test_an_allowed_symlinked_folder_outside_is_read(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "folder", 3)
    _outside(tmp_path)
    (root / "more").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(FlowpostError, match="leads outside"):
        _items(_config(root))
    assert "more/x.png" in [item.name for item in _items(_config(root, allow_outside=True))]
