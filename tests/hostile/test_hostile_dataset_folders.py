"""Hostile image folders, tables and pair folders: a path leading out, a malformed metadata table, a folder
with nothing usable, too many bad items — each stops before or during acquisition with one line naming the
file or dotted path, no traceback, no output written."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hostile_cli import nothing_written, pipeline_with, refused
from PIL import Image


def _png(value: int = 128) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (12, 10), (value, value, value)).save(buffer, format="PNG")
    return buffer.getvalue()


def _folder(root: Path, count: int = 3) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (root / f"{i:02d}.png").write_bytes(_png(20 * i))
        (root / f"{i:02d}.txt").write_text(f"shape {i}")
    return root


def _metadata(root: Path, *lines: str) -> None:
    with (root / "metadata.jsonl").open("a") as handle:
        handle.write("".join(line + "\n" for line in lines))


def _outside(tmp: Path) -> Path:
    target = tmp / "elsewhere" / "secret.png"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(_png(7))
    return target


def _dotdot(tmp: Path) -> tuple[dict, str]:
    _outside(tmp)
    _metadata(_folder(tmp / "data"), json.dumps({"file_name": "../elsewhere/secret.png", "text": "x"}))
    return {"source": "image-folder", "path": "data"}, "data/metadata.jsonl:1"


def _absolute(tmp: Path) -> tuple[dict, str]:
    _metadata(_folder(tmp / "data"), json.dumps({"file_name": str(_outside(tmp)), "text": "x"}))
    return {"source": "image-folder", "path": "data"}, "is an absolute path"


def _deep_dotdot(tmp: Path) -> tuple[dict, str]:
    _metadata(_folder(tmp / "data"), json.dumps({"file_name": "../../../../etc/passwd", "text": "x"}))
    return {"source": "image-folder", "path": "data"}, "leads outside"


def _symlink_file(tmp: Path) -> tuple[dict, str]:
    (_folder(tmp / "data") / "linked.png").symlink_to(_outside(tmp))
    return {"source": "image-folder", "path": "data"}, "linked.png leads outside"


def _symlink_folder(tmp: Path) -> tuple[dict, str]:
    _outside(tmp)
    (_folder(tmp / "data") / "more").symlink_to(tmp / "elsewhere", target_is_directory=True)
    return {"source": "image-folder", "path": "data"}, "leads outside"


def _symlink_metadata(tmp: Path) -> tuple[dict, str]:
    outside = tmp / "elsewhere"
    outside.mkdir()
    (outside / "metadata.jsonl").write_text(json.dumps({"file_name": "00.png", "text": "x"}) + "\n")
    (_folder(tmp / "data") / "metadata.jsonl").symlink_to(outside / "metadata.jsonl")
    return {"source": "image-folder", "path": "data"}, "metadata.jsonl leads outside"


def _video_symlink(tmp: Path) -> tuple[dict, str]:
    data = tmp / "clips"
    data.mkdir()
    (data / "clip.mp4").symlink_to(_outside(tmp))
    return {"source": "video-folder", "path": "clips", "frames": {"count": 2, "fps": 2}}, "clip.mp4 leads outside"


def _table_dotdot(tmp: Path) -> tuple[dict, str]:
    _outside(tmp)
    (tmp / "data").mkdir()
    (tmp / "data" / "t.jsonl").write_text(json.dumps({"image": "../elsewhere/secret.png", "text": "x"}) + "\n")
    return {"source": "table", "path": "data/t.jsonl"}, "data/t.jsonl:1"


def _table_absolute(tmp: Path) -> tuple[dict, str]:
    (tmp / "data").mkdir()
    (tmp / "data" / "t.csv").write_text(f"image,text\n{_outside(tmp)},x\n")
    return {"source": "table", "path": "data/t.csv"}, "is an absolute path"


def _pairs_dotdot(tmp: Path) -> tuple[dict, str]:
    _outside(tmp)
    (tmp / "data").mkdir()
    row = {"chosen": "../elsewhere/secret.png", "rejected": "../elsewhere/secret.png", "text": "x"}
    (tmp / "data" / "pairs.jsonl").write_text(json.dumps(row) + "\n")
    return {"source": "preference-pairs", "path": "data/pairs.jsonl"}, "leads outside"


def _pairs_rejected_link(tmp: Path) -> tuple[dict, str]:
    _folder(tmp / "pairs" / "chosen", 2)
    (tmp / "pairs" / "rejected").mkdir()
    (tmp / "pairs" / "rejected" / "00.png").write_bytes(_png(1))
    (tmp / "pairs" / "rejected" / "01.png").symlink_to(_outside(tmp))
    return {"source": "preference-pairs", "path": "pairs"}, "01.png leads outside"


def _metadata_case(*lines: str, says: str) -> Callable[[Path], tuple[dict, str]]:
    def make(tmp: Path) -> tuple[dict, str]:
        _metadata(_folder(tmp / "data"), *lines)
        return {"source": "image-folder", "path": "data"}, says

    return make


def _empty_folder(tmp: Path) -> tuple[dict, str]:
    (tmp / "data").mkdir()
    (tmp / "data" / "readme.md").write_text("no images here\n")
    return {"source": "image-folder", "path": "data"}, "no .png"


def _missing_folder(tmp: Path) -> tuple[dict, str]:
    return {"source": "image-folder", "path": "data"}, "does not exist"


def _folder_is_file(tmp: Path) -> tuple[dict, str]:
    (tmp / "data").write_text("a file\n")
    return {"source": "image-folder", "path": "data"}, "does not exist"


def _all_unreadable(tmp: Path) -> tuple[dict, str]:
    data = _folder(tmp / "data")
    for image in data.glob("*.png"):
        image.write_bytes(b"\x89PNG broken")
    return {"source": "image-folder", "path": "data"}, "3 of 3 items are bad"


def _no_captions(tmp: Path) -> tuple[dict, str]:
    data = _folder(tmp / "data")
    for caption in data.glob("*.txt"):
        caption.unlink()
    return {"source": "image-folder", "path": "data"}, "missing_caption 3"


def _all_oversized(tmp: Path) -> tuple[dict, str]:
    config = {"source": "image-folder", "path": "data", "preprocess": {"max_megapixels": 0.0001}}
    _folder(tmp / "data")
    return config, "oversized_image 3"


def _table_missing(tmp: Path) -> tuple[dict, str]:
    return {"source": "table", "path": "data/t.parquet"}, "is not a .parquet/.csv/.jsonl file"


def _table_no_image_column(tmp: Path) -> tuple[dict, str]:
    (tmp / "data").mkdir()
    (tmp / "data" / "t.jsonl").write_text(json.dumps({"picture": "a.png", "text": "x"}) + "\n")
    return {"source": "table", "path": "data/t.jsonl"}, "no image column 'image' (columns: picture, text)"


def _pairs_no_rejected_folder(tmp: Path) -> tuple[dict, str]:
    _folder(tmp / "pairs" / "chosen", 2)
    return {"source": "preference-pairs", "path": "pairs"}, "has no rejected/ folder"


def _pairs_no_rejected_column(tmp: Path) -> tuple[dict, str]:
    (tmp / "data").mkdir()
    (tmp / "data" / "pairs.jsonl").write_text(json.dumps({"chosen": "a.png", "text": "x"}) + "\n")
    return {"source": "preference-pairs", "path": "data/pairs.jsonl"}, "no rejected-image column 'rejected'"


CASES: dict[str, Callable[[Path], tuple[dict, str]]] = {
    "metadata-dotdot": _dotdot,
    "metadata-absolute": _absolute,
    "metadata-etc-passwd": _deep_dotdot,
    "symlinked-image-out": _symlink_file,
    "symlinked-folder-out": _symlink_folder,
    "symlinked-metadata-out": _symlink_metadata,
    "video-symlink-out": _video_symlink,
    "table-dotdot": _table_dotdot,
    "table-absolute": _table_absolute,
    "pairs-table-dotdot": _pairs_dotdot,
    "pairs-rejected-links-out": _pairs_rejected_link,
    "metadata-not-json": _metadata_case("{not json", says="data/metadata.jsonl:1: not JSON"),
    "metadata-list": _metadata_case('["00.png"]', says="data/metadata.jsonl:1: expected an object"),
    "metadata-no-file-name": _metadata_case('{"text": "x"}', says="metadata.jsonl:1: this metadata row has no"),
    "metadata-file-name-int": _metadata_case('{"file_name": 3}', says="metadata.jsonl:1: this metadata row has no"),
    "metadata-file-name-null": _metadata_case('{"file_name": null}', says="metadata.jsonl:1: this metadata row has no"),
    "metadata-file-name-empty": _metadata_case('{"file_name": ""}', says="metadata.jsonl:1: this metadata row has no"),
    "metadata-twice": _metadata_case(
        '{"file_name": "00.png", "text": "a"}',
        '{"file_name": "00.png", "text": "b"}',
        says="metadata.jsonl:2: 00.png has a second metadata row",
    ),
    "empty-folder": _empty_folder,
    "missing-folder": _missing_folder,
    "folder-is-a-file": _folder_is_file,
    "all-unreadable": _all_unreadable,
    "no-captions": _no_captions,
    "all-oversized": _all_oversized,
    "table-missing": _table_missing,
    "table-no-image-column": _table_no_image_column,
    "pairs-no-rejected-folder": _pairs_no_rejected_folder,
    "pairs-no-rejected-column": _pairs_no_rejected_column,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_dataset_is_refused_naming_the_place_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.chdir(tmp_path)
    dataset, says = CASES[case](tmp_path)
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump(pipeline_with({"mine": {"preprocess": {"mode": "grayscale"}, **dataset}})))
    workspace = tmp_path / "ws"
    refused("run-node", "acquire.mine", "--pipeline", str(pipeline), "--workspace", str(workspace), naming=says)
    nothing_written(workspace)
