"""Captioned media made in the tests: webdataset shards, short clips (PyAV), saved ``datasets`` datasets."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np


def write_shard(path: Path, samples: list[dict[str, bytes]]) -> Path:
    """A ``.tar`` shard: each sample's ``{"__key__": ..., ext: bytes}`` as members ``KEY.EXT``, in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for sample in samples:
            key = sample["__key__"].decode() if isinstance(sample["__key__"], bytes) else sample["__key__"]
            for ext, data in sample.items():
                if ext != "__key__":
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return path


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=array.dtype == object)
    return buffer.getvalue()


def write_clip(path: Path, *, frames: int = 12, fps: int = 12, size: tuple[int, int] = (24, 16)) -> Path:
    """A clip whose frame ``i`` is a flat grey of level ``20 * i`` (mp4: H.264; webm: VP8), ``fps`` frames a second."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    codec = "libvpx" if path.suffix == ".webm" else "libx264"
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        stream.options = {"crf": "1"} if codec == "libx264" else {"b": "2M"}
        for i in range(frames):
            grey = np.full((size[1], size[0], 3), 20 * i, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(grey, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def save_hf_dataset(path: Path, columns: dict[str, list[Any]], *, image_feature: str | None = "image") -> Path:
    """``columns`` saved with ``save_to_disk``; ``image_feature`` (encoded bytes) as an ``Image`` feature."""
    import datasets

    features = {
        name: datasets.Image()
        if name == image_feature
        else datasets.Value("binary" if isinstance(v[0], bytes) else "string")
        for name, v in columns.items()
    }
    values = {n: [{"bytes": b, "path": None} for b in v] if n == image_feature else v for n, v in columns.items()}
    datasets.Dataset.from_dict(values, features=datasets.Features(features)).save_to_disk(str(path))
    return path
