"""Where a real family's components come from: a local diffusers pipeline folder or a hub id."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from flowpost.core.io import sha256_file
from flowpost.errors import FlowpostError


@dataclass(frozen=True)
class PretrainedSource:
    """A diffusers pipeline (folder or hub id) with the ``from_pretrained`` options every component shares."""

    path: str
    revision: str | None = None
    variant: str | None = None
    torch_dtype: str | None = None  # a torch dtype name, e.g. "bfloat16"; None: as stored

    def load(self, name: str, loader: Any, *, weights: bool = True) -> Any:
        """Component ``name`` (its subfolder) through ``loader.from_pretrained``.

        ``weights``: the component is a model, so ``variant`` and ``torch_dtype`` apply. A missing or
        unloadable component is one ``FlowpostError`` naming it and the pipeline.
        """
        options: dict[str, Any] = {"subfolder": name, "revision": self.revision}
        if weights:
            options["variant"] = self.variant
            if self.torch_dtype is not None:
                dtype_key = "dtype" if loader.__module__.startswith("transformers") else "torch_dtype"
                options[dtype_key] = getattr(torch, self.torch_dtype)
        return self._read(name, loader, loader.from_pretrained, options)

    def config(self, name: str, loader: Any) -> dict[str, Any]:
        """Component ``name``'s config only (``loader.load_config``), without its weights."""
        return dict(self._read(name, loader, loader.load_config, {"subfolder": name, "revision": self.revision}))

    def _read(self, name: str, loader: Any, read: Any, options: dict[str, Any]) -> Any:
        if Path(self.path).is_dir() and not (Path(self.path) / name).is_dir():
            raise FlowpostError(f"the diffusers pipeline folder has no {name!r} component ({name}/)", where=self.path)
        try:
            return read(self.path, **options)
        except (OSError, ValueError) as error:
            raise FlowpostError(
                f"cannot load its {name!r} component ({loader.__name__}): {error}", where=self.path
            ) from error

    def fingerprint(self) -> str:
        """Identifies the weights: every file of a local folder by name and SHA-256 (``model_index.json``
        and the component configs included), or the hub id at its revision (a branch may move)."""
        root = Path(self.path)
        digest = hashlib.sha256()
        if root.is_dir():
            for file in sorted(p for p in root.rglob("*") if p.is_file()):
                digest.update(f"{file.relative_to(root)}\0{sha256_file(file)}\n".encode())
        else:
            digest.update(f"hub\0{self.path}\0{self.revision or 'main'}".encode())
        return digest.hexdigest()

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)
