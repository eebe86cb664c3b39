"""Source hf-dataset: a dataset saved with save_to_disk (Image feature or bytes), each bad kind, a
held-out split; a hub id is refused offline unless pinned, and an uncached one is named."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from image_samples import png_bytes
from media_samples import save_hf_dataset
from PIL import Image

from flowpost.core.config.schema import HfDataset, TableDataset
from flowpost.data.captioned import captioned_split, source_dependencies
from flowpost.data.sources.registry import source_for
from flowpost.errors import FlowpostError


def _config(path: Path, **fields) -> HfDataset:
    return HfDataset(path=str(path), **{"preprocess": {"resolution": 8}, **fields})


def test_a_saved_dataset_with_an_image_feature_and_extra_columns(tmp_path: Path) -> None:
    path = save_hf_dataset(
        tmp_path / "saved", {"image": [png_bytes(1), png_bytes(2)], "text": ["one", "two"], "style": ["a", "b"]}
    )
    config = _config(path)
    split = captioned_split(config, where="datasets.hf")
    assert [(r.prompt, r.metadata) for r in split.train] == [("one", {"style": "a"}), ("two", {"style": "b"})]
    assert split.train[0].image.shape == (3, 8, 8)
    assert source_dependencies(config, where="d") == [str(path)]

    before = source_for(config).fingerprint(where="d")
    assert source_for(config).fingerprint(where="d") == before
    save_hf_dataset(
        tmp_path / "saved2", {"image": [png_bytes(1), png_bytes(3)], "text": ["one", "two"], "style": ["a", "b"]}
    )
    assert source_for(_config(tmp_path / "saved2")).fingerprint(where="d") != before


def _lab_tiff() -> bytes:
    buffer = io.BytesIO()
    Image.new("LAB", (8, 8)).save(buffer, format="TIFF")
    return buffer.getvalue()


def test_each_bad_kind_is_counted_and_past_the_threshold_the_node_fails(tmp_path: Path) -> None:
    good = [png_bytes(i) for i in range(15)]
    images = [*good, png_bytes(3)[:40], _lab_tiff(), png_bytes(4), png_bytes(5), png_bytes(6)]
    captions = [f"shade {i}".encode() for i in range(15)] + [
        b"cut",
        b"lab",
        b"",
        "caf\xe9".encode("latin-1"),
        b"x" * 81,
    ]
    path = save_hf_dataset(tmp_path / "saved", {"picture": images, "caption": captions}, image_feature=None)
    fields = {"image_column": "picture", "max_caption_chars": 80, "preprocess": {"mode": "grayscale"}}
    split = captioned_split(_config(path, **fields, max_bad_fraction=0.5), where="d")
    assert {k: n for k, n in split.bad.counts.items() if n} == {
        "unreadable_image": 1,
        "unconvertible_mode": 1,
        "missing_caption": 1,
        "non_utf8_caption": 1,
        "caption_too_long": 1,
    }
    assert len(split.train) == 15
    with pytest.raises(FlowpostError, match=r"5 of 20 items are bad.*first: unreadable_image: .*row 16") as info:
        captioned_split(_config(path, **fields, max_bad_fraction=0.1), where="datasets.hf")
    assert info.value.where == "datasets.hf.max_bad_fraction"


def test_held_out_split(tmp_path: Path) -> None:
    path = save_hf_dataset(
        tmp_path / "saved", {"image": [png_bytes(i) for i in range(30)], "text": [f"t{i}" for i in range(30)]}
    )
    split = captioned_split(_config(path, split={"eval": 0.3}), where="d")
    assert 0 < len(split.eval) < 30 and not {r.prompt for r in split.eval} & {r.prompt for r in split.train}


def test_splits_folders_missing_columns_and_foreign_folders_are_named(tmp_path: Path) -> None:
    import datasets

    columns = {"image": [{"bytes": png_bytes(), "path": None}], "text": ["x"]}
    one = datasets.Dataset.from_dict(
        columns, features=datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    )
    datasets.DatasetDict({"train": one, "test": one}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(FlowpostError, match="several splits .train, test.; set path to one of them") as info:
        captioned_split(_config(tmp_path / "dict"), where="datasets.hf")
    assert info.value.where == "datasets.hf.path"
    assert len(captioned_split(_config(tmp_path / "dict" / "train"), where="d").train) == 1
    with pytest.raises(FlowpostError, match="no image column 'img' .*image, text.*set image_column"):
        captioned_split(_config(tmp_path / "dict" / "train", image_column="img"), where="d")
    (tmp_path / "plain").mkdir()
    with pytest.raises(FlowpostError, match="save_to_disk"):
        captioned_split(_config(tmp_path / "plain"), where="d")


def test_a_hub_id_offline_needs_a_pinned_commit(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = HfDataset(hub={"id": "someone/pets", "split": "train"})
    with pytest.raises(
        FlowpostError, match="HF_HUB_OFFLINE is set.*revision 'main'.*set hub.revision to a commit"
    ) as info:
        source_for(hub).fingerprint(where="datasets.hf")
    assert info.value.where == "datasets.hf.hub" and source_dependencies(hub, where="d") == []


@pytest.mark.slow  # a fresh process, as `flowpost run-node` is: the hub libraries read HF_HUB_OFFLINE on import
def test_offline_a_pinned_commit_outside_the_cache_is_named(tmp_path: Path) -> None:
    script = (
        "from flowpost.core.config.schema import HfDataset\n"
        "from flowpost.data.captioned import captioned_split\n"
        "from flowpost.errors import FlowpostError\n"
        "hub = HfDataset(hub={'id': 'someone/pets', 'revision': 40 * 'a'})\n"
        "try:\n    captioned_split(hub, where='datasets.hf')\nexcept FlowpostError as exc:\n    print(exc)\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(Path(__file__).parents[3])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert "datasets.hf.hub: cannot load 'someone/pets' at aaaa" in done.stdout, done.stderr
    assert "HF_HUB_OFFLINE set, it is not in the local cache" in done.stdout


def test_online_a_hub_revision_is_fingerprinted_by_the_commit_the_hub_names(monkeypatch) -> None:
    from huggingface_hub import constants

    commits = {"main": "1" * 40}
    with _hub_server(commits) as endpoint:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # as read when not set at import
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        hub = HfDataset(hub={"id": "someone/pets", "revision": "main"})
        before = source_for(hub).fingerprint(where="d")
        assert source_for(hub).fingerprint(where="d") == before
        commits["main"] = "2" * 40  # a push to the branch
        assert source_for(hub).fingerprint(where="d") != before
        missing = HfDataset(hub={"id": "someone/gone"})
        with pytest.raises(FlowpostError, match="RepositoryNotFoundError for 'someone/gone'; fix hub.id") as info:
            source_for(missing).fingerprint(where="datasets.hf")
        assert info.value.where == "datasets.hf.hub"


@contextmanager
def _hub_server(commits: dict[str, str]) -> Iterator[str]:
    """A local endpoint answering the hub's dataset-info route for ``someone/pets`` at ``commits``' revisions."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            prefix = "/api/datasets/someone/pets/revision/"
            revision = self.path.split("?")[0].removeprefix(prefix)
            found = self.path.startswith(prefix) and revision in commits
            body = json.dumps({"id": "someone/pets", "sha": commits[revision]} if found else {"error": "nope"})
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if not found:
                self.send_header("X-Error-Code", "RepoNotFound")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_path_and_hub_are_alternatives() -> None:
    with pytest.raises(ValueError, match="one of 'path'"):
        HfDataset(path="x", hub={"id": "a/b"})
    with pytest.raises(ValueError, match="hub do not apply to source 'table'"):
        TableDataset(path="x", hub={"id": "a/b"})
