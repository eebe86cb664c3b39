"""Source video-folder: clips captioned like an image folder, frames sampled at a count and rate, each bad kind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from media_samples import write_clip

from flowpost.core.config.schema import ImageFolderDataset, VideoFolderDataset
from flowpost.data.captioned import captioned_split
from flowpost.data.shards import read_shards
from flowpost.errors import FlowpostError
from flowpost.tasks.acquire import acquire_dataset

FRAMES = {"frames": {"count": 4, "fps": 4}, "preprocess": {"resolution": 8, "mode": "grayscale"}}


def _config(root: Path, **fields) -> VideoFolderDataset:
    return VideoFolderDataset(path=str(root), **{**FRAMES, **fields})


def _two_clips(root: Path) -> Path:
    write_clip(root / "a.mp4")
    write_clip(root / "sub" / "b.mp4", size=(16, 24))
    (root / "metadata.jsonl").write_text(json.dumps({"file_name": "a.mp4", "text": "a fade", "take": 1}) + "\n")
    (root / "sub" / "b.txt").write_text("a tall fade\n")
    return root


def test_two_mp4s_become_clips_sampled_at_the_configured_count_and_rate(tmp_path: Path) -> None:
    split = captioned_split(_config(_two_clips(tmp_path / "clips")), where="datasets.clips")
    assert [(r.prompt, r.metadata) for r in split.train] == [
        ("a fade", {"file_name": "a.mp4", "take": 1}),
        ("a tall fade", {"file_name": "sub/b.mp4"}),
    ]
    clip = split.train[0].image
    assert clip.shape == (1, 4, 8, 8) and clip.dtype == np.float32  # [C, T, H, W]
    # 12 frames at 12 fps, frame i at grey 20 i: sampling at 4 fps keeps frames 0, 3, 6, 9
    np.testing.assert_allclose(clip.mean(axis=(0, 2, 3)) * 255, [0, 60, 120, 180], atol=3)
    faster = captioned_split(_config(tmp_path / "clips", frames={"count": 5, "fps": 24}), where="d").train[0].image
    np.testing.assert_allclose(faster.mean(axis=(0, 2, 3)) * 255, [0, 0, 20, 20, 40], atol=3)  # frames repeat


def test_a_webm_clip_and_rgb_frames(tmp_path: Path) -> None:
    write_clip(tmp_path / "clips" / "c.webm")
    (tmp_path / "clips" / "c.txt").write_text("a webm fade")
    split = captioned_split(_config(tmp_path / "clips", preprocess={"resolution": 8}), where="d")
    assert split.train[0].image.shape == (3, 4, 8, 8)
    np.testing.assert_allclose(split.train[0].image.mean(axis=(0, 2, 3)) * 255, [0, 60, 120, 180], atol=3)


def _clips_with_one_bad_item_of_each_kind(root: Path) -> Path:
    _two_clips(root)
    for i in range(8):
        write_clip(root / "more" / f"{i}.mp4")
        (root / "more" / f"{i}.txt").write_text(f"fade {i}")
    (root / "cut.mp4").write_bytes(write_clip(tmp := root / "whole.mp4").read_bytes()[:900])  # truncated
    tmp.unlink()
    (root / "text.mp4").write_text("not a video")
    write_clip(root / "short.mp4", frames=3)  # 0.25 s: fewer than 4 frames at 4 fps
    write_clip(root / "silent.mp4")  # no caption
    write_clip(root / "latin.mp4")
    (root / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    write_clip(root / "long.mp4")
    (root / "long.txt").write_text("x" * 81)
    lines = [
        {"file_name": name, "text": f"the {name} clip"} for name in ("cut.mp4", "text.mp4", "short.mp4", "gone.mp4")
    ]
    with (root / "metadata.jsonl").open("a") as handle:
        handle.write("".join(json.dumps(line) + "\n" for line in lines))
    return root


def test_each_bad_kind_is_counted_and_past_the_threshold_the_node_fails(tmp_path: Path) -> None:
    root = _clips_with_one_bad_item_of_each_kind(tmp_path / "clips")
    config = _config(root, max_caption_chars=80, max_bad_fraction=0.5)
    manifest = acquire_dataset(config, tmp_path / "out", where="datasets.clips")
    assert manifest["bad_items"]["counts"] == {
        "unreadable_image": 0,
        "oversized_image": 0,
        "unreadable_video": 3,  # truncated, not a video, missing
        "short_video": 1,
        "unconvertible_mode": 0,
        "missing_caption": 1,
        "non_utf8_caption": 1,
        "caption_too_long": 1,
    }
    assert manifest["counts"] == {"train": 10, "eval": 0, "bad": 7}
    records = read_shards(
        tmp_path / "out" / "train", json.loads((tmp_path / "out" / "train" / "manifest.json").read_text())
    )
    assert {r.image.shape for r in records} == {(1, 4, 8, 8)}

    with pytest.raises(FlowpostError, match=r"7 of 17 items are bad.*unreadable_video 3.*first: .*cut.mp4") as info:
        captioned_split(_config(root, max_caption_chars=80), where="datasets.clips")
    assert info.value.where == "datasets.clips.max_bad_fraction"


def test_held_out_clips_are_disjoint_from_the_training_clips(tmp_path: Path) -> None:
    for i in range(10):
        write_clip(tmp_path / "clips" / f"{i}.mp4", frames=4, fps=4)
        (tmp_path / "clips" / f"{i}.txt").write_text(f"clip {i}")
    split = captioned_split(_config(tmp_path / "clips", split={"eval": 0.3}), where="d")
    assert 0 < len(split.eval) < 10 and len(split.eval) + len(split.train) == 10
    assert not {r.prompt for r in split.eval} & {r.prompt for r in split.train}


def test_frames_apply_to_video_folder_only() -> None:
    with pytest.raises(ValueError, match="frames do not apply to source 'image-folder'.*video-folder"):
        ImageFolderDataset(path="x", frames={"count": 2})
    assert "frames" not in ImageFolderDataset(path="x").model_dump()
    assert VideoFolderDataset(path="x").model_dump()["frames"] == {"count": 8, "fps": 8.0}
