"""A tiny ``edit-pairs`` table: random source and target PNGs and the rows naming them with instructions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

EDITS = 2


def write_edits(folder: Path, instructions: list[str], count: int = EDITS) -> Path:
    """``count`` random 40 px source and target PNGs and the table naming them with instructions."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    rows = []
    for i in range(count):
        for part in ("source", "target"):
            pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{part}-{i}.png")
        rows.append(
            {
                "instruction": instructions[i % len(instructions)],
                "source": f"source-{i}.png",
                "target": f"target-{i}.png",
            }
        )
    table = folder / "pairs.jsonl"
    table.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return table
