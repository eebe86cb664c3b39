"""A dataset's evaluation split as an acquisition left it: held-out prompts and real images."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from flowpost.core.io import read_json
from flowpost.data.shards import read_shards
from flowpost.errors import FlowpostError

HELD_OUT_SHARDS = ("test", "eval")  # the held-out shards a source writes (the digits: test; captioned media: eval)


@dataclass(frozen=True)
class EvalSplit:
    """Held-out prompts with their metadata (a digit's ``label``), and the held-out images [M, C, H, W]."""

    prompts: list[str]
    metadata: list[dict[str, Any]]
    reference: Tensor | None


def read_eval_split(dataset_dir: Path, *, where: str) -> EvalSplit:
    """The held-out prompts named by ``dataset_dir``'s manifest and its held-out images, each image once
    (a digit image appears once per held-out template)."""
    manifest = read_json(dataset_dir / "manifest.json", what="dataset manifest")
    entries = manifest.get("eval_prompts") or []
    if not entries:
        raise FlowpostError(
            f"{dataset_dir} holds no evaluation prompts; give the dataset a held-out split (split.eval)", where=where
        )
    prompts = [str(entry["prompt"]) for entry in entries]
    metadata = [{k: v for k, v in entry.items() if k != "prompt"} for entry in entries]
    return EvalSplit(prompts, metadata, _held_out_images(dataset_dir, manifest))


def _held_out_images(dataset_dir: Path, manifest: dict[str, Any]) -> Tensor | None:
    split = next((name for name in HELD_OUT_SHARDS if name in (manifest.get("shards") or {})), None)
    if split is None:
        return None
    folder = dataset_dir / split
    seen: set[Any] = set()
    images = []
    for record in read_shards(folder, read_json(folder / "manifest.json", what=f"{split} manifest")):
        identity = record.metadata.get("index", record.key)
        if identity not in seen:
            seen.add(identity)
            images.append(torch.from_numpy(record.image))
    return torch.stack(images) if images else None
