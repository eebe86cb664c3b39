"""Media acquisition streams decoded items into per-split shards: the bytes the record-list path wrote,
memory bounded by a shard, nothing left behind on failure, and an item count on a terminal."""

from __future__ import annotations

import hashlib
import io
import tracemalloc
from pathlib import Path

import pytest
from image_samples import make_image_folder, png_bytes

from flowpost.core.config.schema import CaptionedDataset, ImageFolderDataset, dataset_config
from flowpost.core.io import write_json_atomic
from flowpost.data.captioned import captioned_split
from flowpost.data.item_progress import item_progress
from flowpost.data.shards import write_shards
from flowpost.errors import FlowpostError
from flowpost.tasks.acquire import acquire_dataset, acquire_images

REPO = Path(__file__).parents[3]
# Every file acquisition wrote for tests/data/folder (grayscale, split.eval 0.3) before it streamed; the
# manifest is the one written then less its empty "classifiers", a key only the digits source filled.
RECORD_LIST_HASHES = {
    "eval/manifest.json": "ee28aefece74ae408cdb3ae480ebef4c5201cb8e798ee7a50d7936a68ff1650f",
    "eval/shard-000000.tar": "4d7380ef2b75f63caf3e5d6983bbd0d2be2e22c30f3b43d65a19b4ade9c668e5",
    "manifest.json": "b43142d0f2e380c65edea608ea7a5218908dc0de560ea6c1fed08193bd2dc0d9",
    "train/manifest.json": "8ff2c73503ed524468663e418ec5c344fec9fed7bc3ac956a3b9ff2712a91e69",
    "train/shard-000000.tar": "922ae19897f5421c7b7595ac6ecbf3afd5e749c57e66cac60c52e54bccf07e35",
}


def _file_hashes(root: Path) -> dict[str, str]:
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest() for f in root.rglob("*") if f.is_file()
    }


def test_the_shipped_folder_acquires_to_the_bytes_the_record_list_path_wrote(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)  # the manifest records the path as given
    config = ImageFolderDataset(path="tests/data/folder", preprocess={"mode": "grayscale"}, split={"eval": 0.3})
    acquire_dataset(config, tmp_path / "out", where="datasets.shapes")
    assert _file_hashes(tmp_path / "out") == RECORD_LIST_HASHES


@pytest.mark.parametrize("source", ["image-folder", "preference-pairs"])
def test_many_shards_per_split_match_the_record_list_path(tmp_path: Path, source: str) -> None:
    root = tmp_path / "src"
    if source == "preference-pairs":
        make_image_folder(root / "chosen", 23)
        (root / "rejected").mkdir()
        for i in range(23):
            (root / "rejected" / f"{i:02d}.png").write_bytes(png_bytes(5 * i, mode="L"))
        broken = root / "rejected" / "05.png"
    else:
        broken = make_image_folder(root, 23) / "05.png"
    broken.write_bytes(png_bytes()[:30])  # one bad item, counted alike
    fields = {"preprocess": {"resolution": 8}, "split": {"eval": 0.3}, "max_bad_fraction": 0.1}
    config = dataset_config({"source": source, "path": str(root), **fields})
    assert isinstance(config, CaptionedDataset)
    manifest = acquire_images(config, tmp_path / "streamed", where="d", shard_size=3)

    split = captioned_split(config, where="d")  # the record-list path: every record in memory, then written
    expected = {}
    for name, records in split.splits().items():
        expected[name] = write_shards(records, tmp_path / "listed" / name, shard_size=3)
        write_json_atomic(tmp_path / "listed" / name / "manifest.json", expected[name])
    assert len(expected["train"]["shards"]) > 2 and len(expected["eval"]["shards"]) > 1
    for name in expected:
        assert _file_hashes(tmp_path / "streamed" / name) == _file_hashes(tmp_path / "listed" / name)
    assert manifest["counts"] == {"train": len(split.train), "eval": len(split.eval), "bad": 1}
    assert manifest["bad_items"] == split.bad.manifest()
    assert manifest["shards"] == {name: listed["shards"] for name, listed in expected.items()}


def _peak_bytes(action) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_is_bounded_by_a_shard_not_the_source(tmp_path: Path) -> None:
    def config(count: int) -> ImageFolderDataset:
        root = make_image_folder(tmp_path / f"n{count}", count)
        return ImageFolderDataset(path=str(root), preprocess={"resolution": 64}, split={"eval": 0.25})

    small, large = config(12), config(48)
    streamed = [
        _peak_bytes(lambda c=c, n=n: acquire_images(c, tmp_path / f"out{n}", where="d", shard_size=3))
        for n, c in ((12, small), (48, large))
    ]
    listed = [_peak_bytes(lambda c=c: captioned_split(c, where="d")) for c in (small, large)]
    assert listed[1] / listed[0] > 3  # the probe sees memory that grows with the source
    assert streamed[1] / streamed[0] < 2, streamed


def test_a_failure_past_max_bad_fraction_removes_the_shards_it_streamed(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "folder", 8)
    for i in range(3):
        (root / f"z{i}.png").write_bytes(png_bytes()[:30])  # read last: good shards are written before the check
    config = ImageFolderDataset(path=str(root), split={"eval": 0.3})
    out = tmp_path / "node"
    (out / "train").mkdir(parents=True)
    (out / "train" / "shard-000099.tar").write_bytes(b"left by an earlier attempt")
    (out / ".attempt.json").write_text("{}")
    with pytest.raises(FlowpostError, match="3 of 11 items are bad") as info:
        acquire_images(config, out, where="datasets.pets", shard_size=2)
    assert info.value.where == "datasets.pets.max_bad_fraction"
    assert sorted(p.name for p in out.iterdir()) == [".attempt.json"]  # the node folder stays, without shards


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_item_count_shows_on_a_terminal_and_nowhere_else() -> None:
    terminal, log_file = _Terminal(), io.StringIO()
    for stream in (terminal, log_file):  # a generator: the count, with no total to show
        assert list(item_progress((i for i in range(5)), desc="acquire shapes", stream=stream)) == [0, 1, 2, 3, 4]
    assert "acquire shapes: 5item" in terminal.getvalue()
    assert log_file.getvalue() == ""
