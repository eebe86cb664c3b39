"""The model families: the built-ins (a static dict imported lazily) and plugins."""

from __future__ import annotations

from pathlib import Path

from flowpost.core.io import read_json
from flowpost.core.models.base import ADAPTER_FILE, ModelAdapter
from flowpost.core.plugins import Registry

FAMILIES: dict[str, str] = {
    "flux1": "flowpost.core.models.flux1:Flux1Adapter",
    "flux1-kontext": "flowpost.core.models.flux1_kontext:Flux1KontextAdapter",
    "flux2": "flowpost.core.models.flux2:Flux2Adapter",
    "flux2-klein": "flowpost.core.models.flux2:Flux2KleinAdapter",
    "qwen-image": "flowpost.core.models.qwen_image:QwenImageAdapter",
    "qwen-image-edit": "flowpost.core.models.qwen_image_edit:QwenImageEditAdapter",
    "qwen-image-edit-plus": "flowpost.core.models.qwen_image_edit_plus:QwenImageEditPlusAdapter",
    "sd3": "flowpost.core.models.sd3:SD3Adapter",
    "tiny-sd3": "flowpost.core.models.tiny_sd3:TinySD3Adapter",
    "wan2": "flowpost.core.models.wan2:Wan2Adapter",
    "wan22-a14b": "flowpost.core.models.wan22:Wan22Adapter",
    "z-image": "flowpost.core.models.z_image:ZImageAdapter",
}
FAMILY_REGISTRY = Registry(
    "model family",
    plural="model families",
    group="flowpost.models",
    builtins=FAMILIES,
    base="flowpost.core.models.base:ModelAdapter",
)


def adapter_class(family: str, *, where: str = "model.family") -> type[ModelAdapter]:
    """The adapter class ``family`` stands for."""
    return FAMILY_REGISTRY.load(family, where=where)


def load_adapter(path: str | Path) -> ModelAdapter:
    """Load a saved adapter folder, dispatching on the family its manifest names."""
    meta = read_json(Path(path) / ADAPTER_FILE, what="model adapter manifest")
    return adapter_class(meta["family"], where=str(path)).from_pretrained(path)
