"""Write ``tests/data/folder/``: 24 small grayscale shapes in two subfolders, captioned by metadata.jsonl.

Run from the repository root: ``python tests/data/make_folder.py``. The output is committed.
"""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image, ImageDraw

ROOT = Path(__file__).parent / "folder"
SHAPES = ("square", "circle", "bar")
PLACES = {"top left": (1, 1), "top right": (8, 1), "bottom left": (1, 8), "bottom right": (8, 8)}
SHADES = {"white": 255, "grey": 140}


def main() -> None:
    lines = []
    for shape in SHAPES:
        for place, (x, y) in PLACES.items():
            for shade, value in SHADES.items():
                image = Image.new("L", (16, 16), 0)
                draw = ImageDraw.Draw(image)
                box = (x, y, x + 6, y + 6) if shape != "bar" else (x, y + 2, x + 6, y + 4)
                (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=value)
                name = f"{shape}s/{place.replace(' ', '-')}-{shade}.png"
                (ROOT / name).parent.mkdir(parents=True, exist_ok=True)
                image.save(ROOT / name, optimize=True)
                caption = f"a {shade} {shape} in the {place}"
                lines.append(json.dumps({"file_name": name, "text": caption, "shape": shape}))
    (ROOT / "metadata.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
