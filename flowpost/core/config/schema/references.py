"""What a pipeline's datasets, caches and stages refer to: the datasets a cache encodes, the stage and prompts
a sampled dataset reads, a stage's data, latent cache and starting weights. Each check returns
``(config path, problem)`` pairs."""

from __future__ import annotations

from typing import Protocol

from flowpost.core.config.schema.captioned import CaptionedDataset
from flowpost.core.config.schema.datasets import (
    DatasetConfig,
    PromptFilesDataset,
    SampledDataset,
    SampledPairsDataset,
    TrajectoriesDataset,
)
from flowpost.core.config.schema.models import ConditionsConfig, LatentsConfig, ModelConfig
from flowpost.core.config.schema.names import INIT_KEYWORDS, unknown
from flowpost.core.config.schema.sampled import SampledPairsConfig, TrajectoriesConfig
from flowpost.core.config.schema.stages import StageConfig
from flowpost.errors import FlowpostError

Problems = list[tuple[str, str]]


class Sections(Protocol):
    """The sections of a pipeline that references point into."""

    datasets: dict[str, DatasetConfig]
    conditions: dict[str, ConditionsConfig]
    latents: dict[str, LatentsConfig]
    stages: dict[str, StageConfig]


def cache_problems(p: Sections) -> Problems:
    """Each condition cache encodes defined datasets of prompts (a sampled dataset's prompts, not it)."""
    errors = []
    for name, cond in p.conditions.items():
        for i, ds in enumerate(cond.datasets):
            where = f"conditions.{name}.datasets.{i}"
            if ds not in p.datasets:
                errors.append((where, unknown("dataset", ds, p.datasets)))
            elif isinstance(p.datasets[ds], TrajectoriesDataset):
                message = (
                    f"{ds!r} is sampled with this cache's conditions; list its trajectories.prompts dataset instead"
                )
                errors.append((where, message))
            elif isinstance(read := p.datasets[ds], SampledPairsDataset):
                sample = read.sample
                message = (
                    f"dataset {ds!r} is sampled from stage {sample.stage!r} on the prompts of "
                    f"{sample.prompts!r}; list {sample.prompts!r} instead"
                )
                errors.append((where, message))
    return errors


def sampled_dataset_problems(p: Sections, where: str, sampled: TrajectoriesConfig | SampledPairsConfig) -> Problems:
    """A dataset sampled from a finished stage (``where``: its trajectories or sample block): the stage,
    the prompt dataset (not itself sampled) and the condition cache must exist, the cache must encode
    those prompts."""
    errors = []
    if sampled.stage not in p.stages:
        errors.append((f"{where}.stage", unknown("stage", sampled.stage, p.stages)))
    prompts = p.datasets.get(sampled.prompts)
    if prompts is None or isinstance(prompts, SampledDataset):
        others = [n for n, d in p.datasets.items() if not isinstance(d, SampledDataset)]
        errors.append((f"{where}.prompts", unknown("prompt dataset", sampled.prompts, others)))
    cache = p.conditions.get(sampled.conditions)
    if cache is None:
        errors.append((f"{where}.conditions", unknown("conditions", sampled.conditions, p.conditions)))
    elif prompts is not None and sampled.prompts not in cache.datasets:
        message = (
            f"cache {sampled.conditions!r} does not encode dataset {sampled.prompts!r}; "
            f"add it to conditions.{sampled.conditions}.datasets"
        )
        errors.append((f"{where}.conditions", message))
    return errors


def latents_problems(name: str, latents: LatentsConfig, datasets: dict[str, DatasetConfig]) -> Problems:
    """The cache ``latents.<name>`` needs a dataset of media whose preprocessing is deterministic."""
    where = f"latents.{name}"
    dataset = datasets.get(latents.dataset)
    if dataset is None:
        return [(f"{where}.dataset", unknown("dataset", latents.dataset, datasets))]
    if isinstance(dataset, PromptFilesDataset | TrajectoriesDataset):
        return [(f"{where}.dataset", f"dataset {latents.dataset!r} ({dataset.source}) holds no media to encode")]
    if isinstance(dataset, CaptionedDataset) and dataset.preprocess.crop == "random":
        message = (
            f"{where} caches this dataset once, so its preprocessing must be deterministic; set crop: center "
            "(or read the dataset without data.latents)"
        )
        return [(f"datasets.{latents.dataset}.preprocess.crop", message)]
    return []


def data_problems(p: Sections, name: str) -> Problems:
    """Stage ``name``'s data: unknown datasets or caches, a prompt set that is not prompt files, a dataset
    its cache lacks, preference pairs sampled from a stage that does not come earlier."""
    data = p.stages[name].data
    if data is None:
        return []
    errors = []
    cache = p.conditions.get(data.conditions)
    if cache is None:
        errors.append((f"stages.{name}.data.conditions", unknown("conditions", data.conditions, p.conditions)))
    elif problem := _encoder_mismatch(p.stages[name].model, cache, data.conditions):
        errors.append((f"stages.{name}.model.family", problem))
    for key, dataset in (("dataset", data.dataset), ("prompts", data.prompts)):
        if dataset is None:
            continue
        where = f"stages.{name}.data.{key}"
        if dataset not in p.datasets:
            errors.append((where, unknown("dataset", dataset, p.datasets)))
            continue
        read = p.datasets[dataset]
        if key == "prompts" and not isinstance(read, PromptFilesDataset):
            errors.append((where, f"dataset {dataset!r} is not a 'prompt-files' source"))
        stage = read.sample.stage if isinstance(read, SampledPairsDataset) else None
        if stage is not None and stage in p.stages and not _before(p.stages, stage, name):
            errors.append((where, f"dataset {dataset!r} samples stage {stage!r}, which must come earlier"))
        # sampled datasets reuse the conditions of the prompts they were sampled on
        encoded = read.sampled.prompts if isinstance(read, SampledDataset) else dataset
        if cache is not None and encoded not in cache.datasets:
            message = (
                f"cache {data.conditions!r} does not encode dataset {encoded!r}; "
                f"add it to conditions.{data.conditions}.datasets"
            )
            errors.append((f"stages.{name}.data.conditions", message))
    return errors


def latent_reader_problems(p: Sections, name: str) -> Problems:
    """A stage's ``data.latents``: a declared cache of the stage's dataset, filled by the stage's family
    (and pipeline), read by a trainer that encodes dataset media."""
    stage = p.stages[name]
    if stage.data is None or stage.data.latents is None:
        return []
    key = stage.data.latents
    where = f"stages.{name}.data.latents"
    cache = p.latents.get(key)
    if cache is None:
        return [(where, unknown("latents", key, p.latents))]
    errors = []
    if cache.dataset != stage.data.dataset:
        message = (
            f"cache {key!r} encodes dataset {cache.dataset!r}, not {stage.data.dataset!r}; point "
            f"latents.{key}.dataset at {stage.data.dataset!r} or read another cache"
        )
        errors.append((where, message))
    codec, model = cache.model, stage.model
    if codec.family != model.family or (model.pretrained is not None and codec.pretrained != model.pretrained):
        message = (
            f"cache {key!r} was encoded by {codec.family!r} ({codec.pretrained or 'no pipeline'}), the stage trains "
            f"{model.family!r} ({model.pretrained or 'no pipeline'}); set latents.{key}.model to the stage's family "
            "and pretrained"
        )
        errors.append((where, message))
    try:
        reads = stage.arguments().reads_latents
    except (FlowpostError, ValueError):  # an unknown trainer or bad arguments: reported where they are checked
        reads = True
    if not reads:
        errors.append((where, f"trainer {stage.trainer!r} encodes no dataset media; remove data.latents"))
    return errors


def init_problems(name: str, model: ModelConfig, earlier: list[str], *, gated: bool) -> Problems:
    """What is wrong with where stage ``name`` starts from, given the stages defined before it."""
    where = f"stages.{name}.model"
    if model.init == "previous":
        problems = []
        if not gated:
            message = "'previous' starts from the export the promotion gate promoted; configure export.promote"
            problems.append((f"{where}.init", message))
        if model.fallback != "scratch" and model.fallback not in earlier:
            problems.append((f"{where}.fallback", unknown("earlier stage", model.fallback, ["scratch", *earlier])))
        return problems
    if model.init != "scratch" and model.init not in earlier:
        return [(f"{where}.init", unknown("earlier stage", model.init, [*INIT_KEYWORDS, *earlier]))]
    return []


def _encoder_mismatch(model: ModelConfig, cache: ConditionsConfig, key: str) -> str | None:
    """Why a stage's model cannot read the cache ``conditions.<key>``: another family's text encoders
    filled it, or MiniLM did while the stage loads a pretrained family."""
    if cache.model is not None and cache.model.family != model.family:
        return (
            f"{model.family!r} differs from {cache.model.family!r}, whose text encoders filled "
            f"conditions.{key} (conditions.{key}.model.family); use one family"
        )
    if cache.model is None and model.pretrained is not None:
        return (
            f"{model.family!r} loads from model.pretrained, but {cache.encoder} encoded conditions.{key}; "
            f"set conditions.{key}.model to the stage's family and pretrained"
        )
    return None


def _before(stages: dict[str, StageConfig], first: str, second: str) -> bool:
    """Whether stage ``first`` is defined before stage ``second``."""
    order = list(stages)
    return order.index(first) < order.index(second)
