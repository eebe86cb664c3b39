"""How acquisition stores an ``EditPair``: each source as a PNG in ``assets/sources/`` named by the digest of its
bytes, and the pair as the ``Demonstration`` of its target under the edit prompt naming those digests."""

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
    """Write the sources to ``assets_dir`` (once per digest) and return the target's demonstration; its metadata
    adds the ``instruction`` and the first ``source_image`` file relative to ``assets_dir`` (with several
    sources, ``source_images``: every one, in order)."""
    digests, files = [], []
    for source in record.sources:
        data = png_bytes(source)
        digests.append(source_digest(data))
        path = source_file(assets_dir, digests[-1])
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(path, data)
        files.append(str(path.relative_to(assets_dir)))
    metadata = {**record.metadata, "instruction": record.instruction, "source_image": files[0]}
    if len(files) > 1:
        metadata["source_images"] = files
    return Demonstration(
        key=record.key, prompt=edit_prompt(record.instruction, *digests), image=record.target, metadata=metadata
    )
