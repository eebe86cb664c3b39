"""Random edit inputs: source images, and a tiny ``edit-pairs`` table of source and target PNGs (and further
sources) with the rows naming them with instructions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

EDITS = 2


def random_sources(count: int = 2, side: int = 48, seed: int = 0) -> list[Image.Image]:
    """``count`` random RGB source images of ``side`` pixels."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(count)]


def write_edits(folder: Path, instructions: list[str], count: int = EDITS, *, more: tuple[str, ...] = ()) -> Path:
    """``count`` random 40 px source and target PNGs (and one more source per column of ``more``) and the table
    naming them with instructions."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    rows = []
    for i in range(count):
        for part in ("source", "target", *more):
            pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{part}-{i}.png")
        row = {"instruction": instructions[i % len(instructions)], "source": f"source-{i}.png"}
        rows.append({**row, "target": f"target-{i}.png", **{part: f"{part}-{i}.png" for part in more}})
    table = folder / "pairs.jsonl"
    table.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return table
