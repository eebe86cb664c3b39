"""The same captioned images as the three layouts users bring: an image folder, a parquet table, webdataset shards.

Each ``write_*`` writes ``items`` random RGB PNGs of ``size`` pixels (seeded) under ``root`` and returns the
``datasets.<name>`` entry that acquires them.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

PREPROCESS = {"resolution": 64, "crop": "center", "mode": "rgb"}


def _pngs(items: int, size: int) -> list[tuple[str, bytes]]:
    """(caption, PNG bytes) of ``items`` random images, seeded."""
    rng = np.random.default_rng(0)
    images = []
    for i in range(items):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, format="png")
        images.append((f"a random image number {i}", buffer.getvalue()))
    return images


def write_folder(root: Path, items: int, size: int) -> dict[str, Any]:
    """``root/images/*.png`` captioned by ``metadata.jsonl`` (the Hugging Face imagefolder layout)."""
    folder = root / "images"
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (caption, png) in enumerate(_pngs(items, size)):
        (folder / f"{i:06d}.png").write_bytes(png)
        lines.append(json.dumps({"file_name": f"{i:06d}.png", "text": caption}))
    (folder / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return {"source": "image-folder", "path": str(folder), "preprocess": PREPROCESS}


def write_table(root: Path, items: int, size: int) -> dict[str, Any]:
    """``root/table.parquet``: a caption column and an image column of PNG bytes."""
    root.mkdir(parents=True, exist_ok=True)
    captions, pngs = zip(*_pngs(items, size), strict=True)
    pq.write_table(pa.table({"text": list(captions), "image": list(pngs)}), root / "table.parquet")
    return {"source": "table", "path": str(root / "table.parquet"), "preprocess": PREPROCESS}


def write_shards(root: Path, items: int, size: int, per_shard: int = 100) -> dict[str, Any]:
    """``root/shards/train-NNNNNN.tar``: ``KEY.png`` and ``KEY.txt`` per sample."""
    folder = root / "shards"
    folder.mkdir(parents=True, exist_ok=True)
    images = _pngs(items, size)
    paths = []
    for start in range(0, items, per_shard):
        path = folder / f"train-{start // per_shard:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for i, (caption, png) in enumerate(images[start : start + per_shard], start):
                for name, data in ((f"{i:06d}.png", png), (f"{i:06d}.txt", caption.encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return {"source": "webdataset", "shards": paths, "preprocess": PREPROCESS}


WRITERS = {"image-folder": write_folder, "table": write_table, "webdataset": write_shards}
