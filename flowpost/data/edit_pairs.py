"""How acquisition stores an ``EditPair``: its source as a PNG in ``assets/sources/`` named by the digest of its
bytes, and the pair as the ``Demonstration`` of its target under the edit prompt naming that digest."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from flowpost.core.edit_prompts import edit_prompt, source_digest, source_file
from flowpost.core.io import write_bytes_atomic
from flowpost.data.records import Demonstration, EditPair


def png_bytes(image: np.ndarray) -> bytes:
    """An image float32 [C, H, W] in [0, 1] as PNG bytes (8-bit grayscale or RGB)."""
    pixels = (np.clip(image, 0.0, 1.0) * 255).round().astype(np.uint8).transpose(1, 2, 0)
    buffer = io.BytesIO()
    Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def stored_edit(record: EditPair, assets_dir: Path) -> Demonstration:
    """Write the source to ``assets_dir`` (once per digest) and return the target's demonstration; its metadata
    adds the ``instruction`` and the ``source_image`` file relative to ``assets_dir``."""
    data = png_bytes(record.source)
    digest = source_digest(data)
    path = source_file(assets_dir, digest)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, data)
    metadata = {**record.metadata, "instruction": record.instruction, "source_image": str(path.relative_to(assets_dir))}
    return Demonstration(
        key=record.key, prompt=edit_prompt(record.instruction, digest), image=record.target, metadata=metadata
    )
