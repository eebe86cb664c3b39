"""Where a real family's components come from: a local diffusers pipeline folder or a hub id, with
components optionally replaced one by one by folders of their own."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from flowpost.core.io import read_json, sha256_file
from flowpost.errors import FlowpostError

CONFIG_FILES = ("config.json", "scheduler_config.json")  # where a component folder names its class
COMPONENT_LIBRARIES = ("diffusers", "transformers")  # the only modules a model_index.json may name
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name


def is_hub_id(path: str) -> bool:
    """``path`` names a hub repository: no such local path, and it reads ``owner/name``."""
    if HUB_ID.match(path) is None or ".." in path:
        return False
    try:
        return not Path(path).exists()
    except OSError:  # a name too long for a path
        return True


@dataclass(frozen=True)
class PretrainedSource:
    """A diffusers pipeline (folder or hub id) with the ``from_pretrained`` options every component shares.

    ``components`` maps a component name (``transformer``, ``vae``, ``text_encoder``, ...) to a folder
    holding that component alone (what ``save_pretrained`` of the model writes), loaded instead of the
    pipeline's own.
    """

    path: str
    revision: str | None = None
    variant: str | None = None
    torch_dtype: str | None = None  # a torch dtype name, e.g. "bfloat16"; None: as stored
    components: dict[str, str] = field(default_factory=dict)

    def load(self, name: str, loader: Any, *, weights: bool = True) -> Any:
        """Component ``name`` (its subfolder, or its folder in ``components``) through ``loader.from_pretrained``.

        ``weights``: the component is a model, so ``variant`` and ``torch_dtype`` apply. A missing,
        mismatched or unloadable component is one ``FlowpostError`` naming it and the folder.
        """
        options: dict[str, Any] = {}
        if weights:
            options["variant"] = self.variant
            if self.torch_dtype is not None:
                dtype_key = "dtype" if loader.__module__.startswith("transformers") else "torch_dtype"
                options[dtype_key] = getattr(torch, self.torch_dtype)
        return self._read(name, loader, loader.from_pretrained, options)

    def empty(self, name: str, loader: Any) -> torch.nn.Module:
        """Component ``name`` built from its config alone on the meta device, in ``torch_dtype`` (float32 when
        unset, as diffusers loads it): its parameters' shapes and dtypes without reading any weight."""
        config = self.config(name, loader)
        with torch.device("meta"):
            module = loader.from_config(config)
        torch.nn.Module.to(module, getattr(torch, self.torch_dtype or "float32"))  # diffusers' to() warns here
        kept = getattr(module, "_keep_in_fp32_modules", None) or []  # as from_pretrained keeps them
        for path, child in module.named_modules():
            if any(part in kept for part in path.split(".")):
                child.float()
        return module

    def config(self, name: str, loader: Any) -> dict[str, Any]:
        """Component ``name``'s config only (``loader.load_config``), without its weights."""
        return dict(self._read(name, loader, loader.load_config, {}))

    def _read(self, name: str, loader: Any, read: Any, options: dict[str, Any]) -> Any:
        where = self.components.get(name)
        if where is not None:
            self._check_override(name, Path(where), loader)
        else:
            if not Path(self.path).is_dir() and not is_hub_id(self.path):
                raise FlowpostError(
                    "the pipeline folder does not exist or is a file; give a diffusers pipeline folder or a hub "
                    "id (owner/name)",
                    where=self.path,
                )
            if Path(self.path).is_dir() and not (Path(self.path) / name).is_dir():
                raise FlowpostError(
                    f"the diffusers pipeline folder has no {name!r} component ({name}/)", where=self.path
                )
            where, options = self.path, {"subfolder": name, "revision": self.revision, **options}
        try:
            return read(where, **options)
        except (OSError, ValueError) as error:
            message = f"cannot load its {name!r} component ({loader.__name__}): {error}"
            raise FlowpostError(message, where=where) from error

    def _check_override(self, name: str, folder: Path, loader: Any) -> None:
        """The folder replacing component ``name`` exists and declares ``loader``'s class (when it declares one)."""
        if not folder.is_dir():
            raise FlowpostError(
                f"the folder given for the {name!r} component does not exist; give a folder its "
                "save_pretrained wrote (model.components)",
                where=str(folder),
            )
        declared = _declared_class(folder)
        if declared is not None and declared != loader.__name__:
            raise FlowpostError(
                f"the folder given for the {name!r} component holds a {declared}, but the pipeline's {name} "
                f"is a {loader.__name__} (model.components.{name})",
                where=str(folder),
            )

    def check_components(self) -> None:
        """Every overridden component is one the pipeline has (its ``model_index.json`` lists it)."""
        if not self.components:
            return
        component_names = set(self._model_index())
        unknown = sorted(set(self.components) - component_names)
        if unknown:
            raise FlowpostError(
                f"model.components names {', '.join(map(repr, unknown))}, which the pipeline has no component "
                f"of (its components: {', '.join(sorted(component_names))})",
                where=self.path,
            )

    def load_overrides(self, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        """The overridden components but ``skip``, each loaded as the pipeline's model index names its class."""
        import importlib

        index = self._model_index()
        parts = {}
        for name in sorted(set(self.components) - set(skip)):
            library, class_name = index[name]
            loader = getattr(importlib.import_module(library), class_name, None)
            if not isinstance(loader, type):
                raise FlowpostError(
                    f"model_index.json names {library}.{class_name} for component {name!r}, which {library} "
                    "does not have; fix the folder's model_index.json or upgrade the library",
                    where=self.path,
                )
            parts[name] = self.load(name, loader, weights=issubclass(loader, torch.nn.Module))
        return parts

    def _model_index(self) -> dict[str, tuple[str, str]]:
        """Component name -> (library, class) from the pipeline's ``model_index.json``."""
        from diffusers import DiffusionPipeline

        try:
            index = DiffusionPipeline.load_config(self.path, revision=self.revision)
        except (OSError, ValueError) as error:
            raise FlowpostError(f"cannot read the pipeline's model_index.json: {error}", where=self.path) from error
        components = {
            name: (entry[0], entry[1])
            for name, entry in index.items()
            if isinstance(entry, list) and entry[0] is not None
        }
        for name, (library, class_name) in components.items():
            if library not in COMPONENT_LIBRARIES:
                raise FlowpostError(
                    f"model_index.json names {library}.{class_name} for component {name!r}; components load only "
                    f"from {' or '.join(COMPONENT_LIBRARIES)}, and no other module is imported: fix the folder's "
                    "model_index.json",
                    where=self.path,
                )
        return components

    def unreachable(self) -> str | None:
        """Why this pipeline cannot be read, in one line (a folder or component folder that is not there, a
        hub id neither cached nor downloadable), else None; reads at most its ``model_index.json``."""
        for name, folder in sorted(self.components.items()):
            if not Path(folder).is_dir():
                return f"its {name!r} component folder {folder} does not exist"
        if Path(self.path).is_dir():
            if not (Path(self.path) / "model_index.json").is_file():
                return f"{self.path} is not a diffusers pipeline folder (it has no model_index.json)"
            return None
        if not is_hub_id(self.path):
            return f"{self.path} does not exist"
        from diffusers import DiffusionPipeline

        try:
            DiffusionPipeline.load_config(self.path, revision=self.revision)
        except (OSError, ValueError):
            return f"{self.path} is neither a folder here nor a hub pipeline in the local cache or downloadable now"
        return None

    def fingerprint(self) -> str:
        """Identifies the weights: every file of a local folder by name and SHA-256 (``model_index.json``
        and the component configs included), or the hub id at its revision (a branch may move); then each
        overriding component folder's files alike."""
        digest = hashlib.sha256()
        if Path(self.path).is_dir():
            _digest_folder(digest, Path(self.path))
        else:
            digest.update(f"hub\0{self.path}\0{self.revision or 'main'}".encode())
        for name, folder in sorted(self.components.items()):
            digest.update(f"component\0{name}\n".encode())
            _digest_folder(digest, Path(folder))
        return digest.hexdigest()

    def component_fingerprint(self, name: str) -> str:
        """Identifies component ``name`` alone: its folder's files (the pipeline's subfolder, or the folder
        replacing it), or the hub id at its revision."""
        digest = hashlib.sha256()
        folder = Path(self.components.get(name) or Path(self.path) / name)
        if folder.is_dir():
            _digest_folder(digest, folder)
        else:
            digest.update(f"hub\0{self.path}\0{self.revision or 'main'}\0{name}".encode())
        return digest.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _digest_folder(digest: Any, root: Path) -> None:
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(root)}\0{sha256_file(file)}\n".encode())


def _declared_class(folder: Path) -> str | None:
    """The class a component folder's config names: diffusers' ``_class_name`` or transformers' architecture."""
    for name in CONFIG_FILES:
        if (folder / name).is_file():
            config = read_json(folder / name, what="component config")
            architectures = config.get("architectures") or [None]
            return config.get("_class_name") or architectures[0]
    return None
