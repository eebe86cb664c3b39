"""A ``model:`` block checked before anything runs: the family's ``options`` (names, value types and, from a
local folder, the family constructor's own refusals) and a local ``pretrained`` folder's ``model_index.json``
and component configs (the family's pipeline and transformer classes, a flow-matching scheduler, the folders
of ``components``); no weight is read. A hub id is not checked offline. The channels the family's output codec
takes and the narrowest layer a LoRA adapts are read the same way, for the pipeline checks."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, NamedTuple

from flowpost.core.io import read_json_object
from flowpost.core.models.pretrained import COMPONENT_LIBRARIES, CONFIG_FILES, PretrainedSource, is_hub_id
from flowpost.errors import FlowpostError

MODEL_INDEX = "model_index.json"
FLOW_MATCH_EULER = "FlowMatchEulerDiscreteScheduler"  # what every pipeline family samples with
FLOW_SIGMAS = {"UniPCMultistepScheduler": "use_flow_sigmas"}  # flow-matching only with this config flag true
TYPES = {
    "bool": (bool, "true or false"),
    "int": (int, "an int"),
    "float": (float, "a number"),
    "str": (str, "a string"),
}


def model_problems(
    where: str,
    family: str,
    pretrained: str | None,
    *,
    options: dict[str, Any] | None = None,
    components: dict[str, str] | None = None,
    encoders_only: bool = False,
) -> list[str]:
    """What is wrong with the ``model:`` block at dotted path ``where``, one ``path: message`` line each.

    ``encoders_only``: the block fills a condition cache, so only the pipeline class and the text encoders its
    ``model_index.json`` lists matter.
    """
    from flowpost.core.models.pipeline_family import PipelineFamily
    from flowpost.core.models.registry import FAMILY_REGISTRY, adapter_class

    if problem := FAMILY_REGISTRY.problem(family, where=f"{where}.family"):
        return [problem]
    cls = adapter_class(family, where=f"{where}.family")
    if pretrained is None:
        return []
    if not issubclass(cls, PipelineFamily):
        return [f"{where}.pretrained: family {family!r} loads no diffusers pipeline; remove pretrained"]
    options, components = options or {}, components or {}
    try:
        return _model_problems(where, cls, pretrained, options, components, encoders_only=encoders_only)
    except OSError as error:
        return [
            f"{where}.pretrained: cannot read {error.filename or pretrained} ({error.strerror or error}); fix the path"
        ]


def _model_problems(
    where: str, cls: Any, pretrained: str, options: dict[str, Any], components: dict[str, str], *, encoders_only: bool
) -> list[str]:
    """``model_problems`` past the family: options, component folders, the pipeline folder, option values."""
    problems = unknown_options(f"{where}.options", cls, options)
    problems += [
        f"{where}.components.{name}: {folder} is not a folder; give one that save_pretrained of the component wrote"
        for name, folder in sorted(components.items())
        if not Path(folder).is_dir()
    ]
    hub = is_hub_id(pretrained)
    if not hub:
        needed = _text_components(cls) if encoders_only else ("transformer", "scheduler", "vae")
        problems += _folder_problems(where, cls, Path(pretrained), components, needed, listed_only=encoders_only)
    if problems or encoders_only:
        return problems
    if problems := _override_problems(where, cls, components):
        return problems
    source = None if hub else PretrainedSource(pretrained, components=dict(components))
    return value_problems(where, cls, options, source)


def unknown_options(where: str, cls: Any, options: dict[str, Any]) -> list[str]:
    """The options family ``cls`` does not have, with the ones it has."""
    if unknown := sorted(set(options) - set(cls.options)):
        accepted = ", ".join(cls.options) or "none"
        return [f"{where}: family {cls.family!r} has no option {', '.join(unknown)}; accepted: {accepted}"]
    return []


def value_problems(where: str, cls: Any, options: dict[str, Any], source: PretrainedSource | None) -> list[str]:
    """Option values of a type the family's constructor does not take, and, from a local folder
    (``source``), the constructor's own refusals: it runs on a meta-device transformer built from the
    folder's configs, so a resolution or frame count the VAE and transformer cannot make is named too."""
    annotations = _option_annotations(cls)
    found = {
        f"{where}.options.{name}": problem
        for name, value in options.items()
        if (problem := _type_problem(name, value, annotations.get(name, ""))) is not None
    }
    if source is None or not options:
        return [f"{path}: {message}" for path, message in found.items()]
    try:
        cls.without_weights(source, **options)
    except FlowpostError as error:
        if error.where is None or not error.where.startswith("model."):
            return [f"{where}.pretrained: {error}"]
        found[where + error.where.removeprefix("model")] = str(error).removeprefix(f"{error.where}: ")
    except Exception as error:  # noqa: BLE001 - a value the family's code cannot take, reported as such
        if not found:
            found[f"{where}.options"] = f"family {cls.family!r} cannot take them ({type(error).__name__}: {error})"
    return [f"{path}: {message}" for path, message in found.items()]


def _option_annotations(cls: type) -> dict[str, str]:
    """Keyword-only constructor parameter -> its annotation text, the most derived class's first."""
    found: dict[str, str] = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        for parameter in inspect.signature(klass.__init__).parameters.values():
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
                annotation = parameter.annotation
                text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
                found.setdefault(parameter.name, text)
    return found


def _type_problem(name: str, value: Any, annotation: str) -> str | None:
    """Why ``value`` is not of ``annotation`` (``int``, ``float | None``, ...); None when it is or is unknown."""
    kinds = [part.strip() for part in annotation.split("|")]
    if value is None and "None" in kinds:
        return None
    expected = [TYPES[kind] for kind in kinds if kind in TYPES]
    if not expected or any(_is(value, kind) for kind, _ in expected):
        return None
    wanted = " or ".join(text for _, text in expected)
    return f"{name} {value!r} is a {type(value).__name__}; give {wanted}"


def _is(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind) and not isinstance(value, bool)


def _text_components(cls: Any) -> tuple[str, ...]:
    """The text encoder and tokenizer components the family's conditions load."""
    names: list[str] = []
    for index in range(len(cls.text_models)):
        suffix = f"_{index + 1}" if index else ""
        names += [f"text_encoder{suffix}", f"tokenizer{suffix}"]
    return tuple(names)


def _folder_problems(
    where: str, cls: Any, folder: Path, components: dict[str, str], needed: tuple[str, ...], *, listed_only: bool
) -> list[str]:
    """The local pipeline folder: a folder with a ``model_index.json`` of the family's pipeline and transformer
    listing the ``needed`` components (their folders too unless ``listed_only``) and the overridden ones, and a
    flow-matching scheduler config."""
    at = f"{where}.pretrained"
    if not folder.exists():
        return [
            f"{at}: {folder} does not exist; give a diffusers pipeline folder (what a pipeline's save_pretrained "
            "writes) or a hub id (owner/name)"
        ]
    if not folder.is_dir():
        return [f"{at}: {folder} is a file; give the diffusers pipeline folder holding {MODEL_INDEX}"]
    if not (folder / MODEL_INDEX).is_file():
        return [
            f"{at}: {folder} holds no {MODEL_INDEX}, so it is no diffusers pipeline folder; give the folder a "
            "pipeline's save_pretrained wrote"
        ]
    try:
        index = read_json_object(folder / MODEL_INDEX, what=MODEL_INDEX)
    except FlowpostError as error:
        return [f"{at}: {error}"]
    listed = {
        name: entry for name, entry in index.items() if isinstance(entry, list) and entry and entry[0] is not None
    }
    if problem := _class_problem(cls, folder, index, listed):
        return [f"{at}: {problem}"]
    for name, entry in listed.items():
        if entry[0] not in COMPONENT_LIBRARIES:
            return [
                f"{at}: {folder / MODEL_INDEX} names {entry[0]}.{entry[-1]} for component {name!r}; components load "
                f"only from {' or '.join(COMPONENT_LIBRARIES)}: fix the folder's {MODEL_INDEX}"
            ]
    if unknown := sorted(set(components) - set(listed)):
        return [
            f"{where}.components: names {', '.join(map(repr, unknown))}, which the pipeline has no component of "
            f"(its components: {', '.join(sorted(listed))})"
        ]
    problems = []
    for name in needed:
        if name in components:
            continue
        if name not in listed:
            problems.append(
                f"{at}: {folder / MODEL_INDEX} lists no {name!r} component, which family {cls.family!r} loads"
            )
        elif not listed_only and not (folder / name).is_dir():
            problems.append(f"{at}: {folder} has no {name}/ folder, which its {MODEL_INDEX} lists")
        elif name == "scheduler" and (problem := _scheduler_problem(cls, folder / name)):
            problems.append(f"{at}: {problem}")
        elif name == "transformer" and (problem := _declared_problem(cls, folder / name)):
            problems.append(f"{at}: {problem}")
    return problems


def _class_problem(cls: Any, folder: Path, index: dict[str, Any], listed: dict[str, list[Any]]) -> str | None:
    """Why the pipeline ``model_index.json`` describes is not the family's (its pipeline or transformer class)."""
    pipeline = index.get("_class_name")
    transformer = listed.get("transformer", [None, None])[-1]
    if pipeline == cls.pipeline_class and transformer == cls.transformer_class:
        return None
    matching = [name for name, other in _pipeline_families().items() if other.pipeline_class == pipeline]
    fix = f"set model.family: {matching[0]}" if matching else f"give a {cls.pipeline_class} folder"
    return (
        f"{folder} holds a {pipeline} (transformer {transformer}), and family {cls.family!r} loads a "
        f"{cls.pipeline_class} with a {cls.transformer_class}; {fix}"
    )


def _pipeline_families() -> dict[str, Any]:
    from flowpost.core.models.pipeline_family import PipelineFamily
    from flowpost.core.models.registry import FAMILY_REGISTRY, adapter_class

    names = FAMILY_REGISTRY.entries(where="model.family")
    classes = {name: adapter_class(name) for name in names if not FAMILY_REGISTRY.problem(name, where="model.family")}
    return {name: cls for name, cls in classes.items() if issubclass(cls, PipelineFamily)}


def _override_problems(where: str, cls: Any, components: dict[str, str]) -> list[str]:
    """The folders replacing the transformer and the scheduler hold the family's transformer and a flow-matching
    scheduler."""
    problems = []
    if "transformer" in components and (problem := _declared_problem(cls, Path(components["transformer"]))):
        problems.append(f"{where}.components.transformer: {problem}")
    if "scheduler" in components and (problem := _scheduler_problem(cls, Path(components["scheduler"]))):
        problems.append(f"{where}.components.scheduler: {problem}")
    return problems


def _declared_problem(cls: Any, folder: Path) -> str | None:
    """Why the transformer config in ``folder`` is not the family's transformer class."""
    config = _config(folder)
    if isinstance(config, str):
        return config
    declared = config.get("_class_name") or (config.get("architectures") or [None])[0]
    if declared is None or declared == cls.transformer_class:
        return None
    return f"{folder} holds a {declared}, and family {cls.family!r} trains a {cls.transformer_class}"


def _scheduler_problem(cls: Any, folder: Path) -> str | None:
    """Why the scheduler config in ``folder`` is not a flow-matching scheduler the family samples with."""
    config = _config(folder)
    if isinstance(config, str):
        return config
    name = config.get("_class_name")
    accepted = cls.scheduler_classes
    if name not in accepted:
        return (
            f"{folder} holds a {name!r} scheduler; family {cls.family!r} samples flow-matching sigmas with "
            f"{' or '.join(accepted)} only: give the pipeline a {FLOW_MATCH_EULER} config"
        )
    flag = FLOW_SIGMAS.get(name)
    if flag is not None and config.get(flag) is not True:
        return f"{folder} holds a {name} without {flag}, which is no flow-matching scheduler; set {flag}: true"
    return None


def _config(folder: Path) -> dict[str, Any] | str:
    """A component folder's config (``config.json`` or ``scheduler_config.json``), or why there is none."""
    for name in CONFIG_FILES:
        if (folder / name).is_file():
            try:
                return read_json_object(folder / name, what="component config")
            except FlowpostError as error:
                return str(error)
    return f"{folder} holds no {' or '.join(CONFIG_FILES)}; give a folder save_pretrained of the component wrote"


class Codec(NamedTuple):
    """The image channels a family's output codec takes, and what says so."""

    channels: int
    description: str
    pixel_space: bool  # the transformer takes the images themselves (no VAE)


def codec_channels(
    family: str, pretrained: str | None, *, components: dict[str, str] | None = None, transformer: dict[str, Any]
) -> Codec | None:
    """Family ``family``'s output codec: a pipeline family's VAE ``in_channels`` from a local folder's
    ``vae/config.json`` (None for a hub id or an unreadable config); a pixel-space family's transformer
    ``in_channels`` (``transformer``: its config overrides)."""
    from flowpost.core.models.pipeline_family import PipelineFamily
    from flowpost.core.models.registry import FAMILY_REGISTRY, adapter_class

    if FAMILY_REGISTRY.problem(family, where="model.family"):
        return None
    cls = adapter_class(family)
    if not issubclass(cls, PipelineFamily):
        channels = None if pretrained is not None else cls.scratch_channels(transformer)
        if channels is None:
            return None
        return Codec(channels, f"the transformer of family {family!r} (in_channels {channels}, in pixel space)", True)
    if pretrained is None or is_hub_id(pretrained):
        return None
    folder = Path((components or {}).get("vae") or Path(pretrained) / "vae")
    config = _config(folder)
    if isinstance(config, str):
        return None
    declared = int(config.get("in_channels", config.get("input_channels", 3)))  # diffusers' VAEs default to RGB
    patch = config.get("patch_size") or 1  # Wan2.2's VAE patchifies its input: in_channels counts the patches
    patch = patch if isinstance(patch, int) else 1  # FLUX.2's (a pair) patches its latents, not its input
    what = f"in_channels {declared}" + (f", {patch}x{patch} patches of {declared // patch**2}" if patch > 1 else "")
    return Codec(declared // patch**2, f"the VAE of family {family!r} ({folder}: {what})", False)


def smallest_lora_layer(
    family: str,
    pretrained: str | None,
    *,
    options: dict[str, Any],
    components: dict[str, str] | None,
    transformer: dict[str, Any],
    targets: list[str] | None,
) -> tuple[int, str] | None:
    """The narrowest layer LoRA with ``targets`` (default: the family's) adapts, as ``min(in, out)`` features and
    its module name, from the transformer built on the meta device; None when it cannot be built offline."""
    import torch

    from flowpost.core.models.pipeline_family import PipelineFamily
    from flowpost.core.models.registry import FAMILY_REGISTRY, adapter_class

    if FAMILY_REGISTRY.problem(family, where="model.family"):
        return None
    cls = adapter_class(family)
    try:
        if issubclass(cls, PipelineFamily):
            if pretrained is None or is_hub_id(pretrained):
                return None
            source = PretrainedSource(pretrained, components=dict(components or {}))
            network = cls.without_weights(source, **options).module()
        elif pretrained is None:
            network = _scratch_network(cls, transformer).module()
        else:
            return None
    except Exception:  # noqa: BLE001 - a model block the checks above refuse, or one only a run can judge
        return None
    names = tuple(targets or getattr(cls, "lora_targets", ()))
    widths = [
        (min(module.in_features, module.out_features), path)
        for path, module in network.named_modules()
        if isinstance(module, torch.nn.Linear) and any(path == t or path.endswith(f".{t}") for t in names)
    ]
    return min(widths) if widths else None


def _scratch_network(cls: Any, transformer: dict[str, Any]) -> Any:
    """A family trained from scratch, its transformer (with the ``transformer`` overrides) on the meta device."""
    import torch

    with torch.device("meta"):
        return cls.from_scratch(seed=0, overrides=transformer)
