"""Static registry of model families (lazy imports)."""

from __future__ import annotations

from pathlib import Path

from flowpost.core.io import read_json
from flowpost.core.lazy import import_object
from flowpost.core.models.base import ADAPTER_FILE, ModelAdapter
from flowpost.errors import FlowpostError

FAMILIES: dict[str, str] = {
    "tiny-sd3": "flowpost.core.models.tiny_sd3:TinySD3Adapter",
}


def adapter_class(family: str, *, where: str = "model.family") -> type[ModelAdapter]:
    """The adapter class registered for ``family``."""
    if family not in FAMILIES:
        raise FlowpostError(f"unknown model family {family!r}; known: {', '.join(sorted(FAMILIES))}", where=where)
    return import_object(FAMILIES[family])


def load_adapter(path: str | Path) -> ModelAdapter:
    """Load a saved adapter folder, dispatching on the family its manifest names."""
    meta = read_json(Path(path) / ADAPTER_FILE, what="model adapter manifest")
    return adapter_class(meta["family"], where=str(path)).from_pretrained(path)
