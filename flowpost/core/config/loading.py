"""Load a pipeline file, apply dotted overrides, validate, and report errors by dotted path."""

from __future__ import annotations

import copy
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from flowpost.core.config.export_formats import export_format_problems
from flowpost.core.config.quantize_checks import quantize_problems
from flowpost.core.config.schema.captioned import CaptionedDataset
from flowpost.core.config.schema.datasets import (
    DatasetConfig,
    PromptFilesDataset,
    SampledPairsDataset,
    TrajectoriesDataset,
)
from flowpost.core.config.schema.models import ModelConfig
from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.core.config.schema.rewards import RewardConfig
from flowpost.core.config.schema.sampled import TRAJECTORIES
from flowpost.core.config.schema.stages import StageConfig
from flowpost.core.contracts import Acquisition, ExecutionContract, Feedback, Paradigm
from flowpost.core.lazy import unknown_name
from flowpost.core.logging import get_logger
from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.trainers.arguments import TrainerArguments
from flowpost.core.trainers.optimizer_settings import AdamWSettings
from flowpost.errors import FlowpostError

if TYPE_CHECKING:
    from flowpost.core.models.folder_checks import Codec

DEFAULT_PIPELINE = "digits"
log = get_logger(__name__)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 scalars: ``1e-4`` is a float, only ``true``/``false`` are booleans
    (``no``, ``on``, ``yes`` stay strings, as DVC's YAML writer assumes); a key given twice in one
    mapping is an error (``<<`` merges may still be overridden)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    problem=f"duplicate key {key!r} (first at line {first_line[key]}); keep one of them",
                    problem_mark=key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_BOOL = "tag:yaml.org,2002:bool"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _parse(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def default_pipeline_path() -> Path:
    """The embedded default pipeline shipped as package data."""
    return Path(str(resources.files("flowpost") / "pipelines" / f"{DEFAULT_PIPELINE}.yaml"))


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Parse a YAML mapping; syntax errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FlowpostError("pipeline file not found; check the path", where=str(path)) from None
    except IsADirectoryError:
        raise FlowpostError("this is a folder; give the pipeline YAML file", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FlowpostError(f"cannot read the pipeline file: {exc}", where=str(path)) from None
    try:
        data = _parse(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise FlowpostError(f"invalid YAML: {problem}", where=f"{path}{line}") from None
    if not isinstance(data, dict):
        raise FlowpostError("a pipeline file must be a YAML mapping at the top level", where=str(path))
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b.c=value``; the value is parsed as YAML (numbers, booleans, lists)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise FlowpostError(f"override {text!r} must look like dotted.path=value", where="--set")
    try:
        value = _parse(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``dotted.path=value`` set."""
    result = copy.deepcopy(data)
    for text in overrides:
        key, value = parse_override(text)
        node: Any = result
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise FlowpostError(f"cannot set {key!r}: {where} is not a mapping", where="--set")
            node = child
        node[parts[-1]] = value
    return result


def validate_pipeline(
    data: dict[str, Any], *, source: str = "pipeline", warnings: list[str] | None = None
) -> PipelineConfig:
    """Validate a raw mapping, including each stage's ``train:`` section against its trainer.

    ``warnings`` collects what validates but cannot work as meant (``pipeline_warnings``); None logs them.
    """
    try:
        pipeline = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise FlowpostError(_format_errors(exc, prefix=""), where=source) from None
    for name, stage in pipeline.stages.items():
        try:
            arguments = stage.arguments(where=f"stages.{name}.trainer")
        except ValidationError as exc:
            raise FlowpostError(_format_errors(exc, prefix=f"stages.{name}.train."), where=source) from None
        except FlowpostError as exc:
            raise FlowpostError(str(exc), where=source) from None
        stage.train = arguments.model_dump(mode="json")
        problems = _stage_problems(name, stage, arguments.execution_contract, pipeline.datasets)
        problems += _sampling_problems(name, stage, arguments.paradigm)
        problems += [f"stages.{name}.{p}" for p in arguments.sampling_problems(stage.sampling or SamplingConfig())]
        problems += _role_problems(name, stage, arguments)
        problems += _optimizer_problems(name, stage, arguments)
        problems += _distillation_problems(name, stage, arguments, pipeline.datasets)
        problems += _guard_problems(name, stage, arguments, pipeline.datasets)
        problems += _stage_model_problems(name, stage)
        problems += quantize_problems(name, stage)
        problems += _stage_channel_problems(name, stage, arguments.execution_contract, pipeline)
        if problems:
            raise FlowpostError("invalid configuration:\n  " + "\n  ".join(problems), where=source)
    problems = _cache_model_problems(pipeline) + _latent_channel_problems(pipeline) + export_format_problems(pipeline)
    if problems := problems + _metric_problems(pipeline) + _curve_problems(pipeline):
        raise FlowpostError("invalid configuration:\n  " + "\n  ".join(problems), where=source)
    if problems := _gate_problems(pipeline):
        raise FlowpostError("invalid configuration:\n  " + "\n  ".join(problems), where=source)
    found = pipeline_warnings(pipeline)
    if warnings is not None:
        warnings.extend(found)
        return pipeline
    for warning in found:
        log.warning("%s: %s", source, warning)
    return pipeline


def _stage_model_problems(name: str, stage: StageConfig) -> list[str]:
    """The stage's ``model.options`` and local ``model.pretrained`` folder, against its family."""
    from flowpost.core.models.folder_checks import model_problems
    from flowpost.core.models.registry import FAMILY_REGISTRY, adapter_class

    model = stage.model
    if FAMILY_REGISTRY.problem(model.family, where=f"stages.{name}.model.family"):  # _stage_problems names it
        return []
    where = f"stages.{name}.model"
    problems = model_problems(where, model.family, model.pretrained, options=model.options, components=model.components)
    launch = stage.launch
    if launch.backend == "fsdp2" and launch.num_processes > 1 and not adapter_class(model.family).fsdp_shardable:
        problems.append(
            f"stages.{name}.launch.backend: family {model.family!r} runs different blocks on different ranks, "
            "which fsdp2's collective gathers cannot follow; use ddp or deepspeed-zero2"
        )
    return problems


def _cache_model_problems(pipeline: PipelineConfig) -> list[str]:
    """The models filling condition caches (their text encoders, or the registered ``encoder``) and latent caches
    (their codec), against their families."""
    from flowpost.core.models.folder_checks import model_problems
    from flowpost.core.models.text_encoders import ENCODER_REGISTRY

    problems = []
    for key, cache in pipeline.conditions.items():
        if (encoders := cache.model) is not None:
            where = f"conditions.{key}.model"
            problems += model_problems(
                where, encoders.family, encoders.pretrained, components=encoders.components, encoders_only=True
            )
        elif problem := ENCODER_REGISTRY.problem(cache.encoder, where=f"conditions.{key}.encoder"):
            problems.append(problem)
    for key, latents in pipeline.latents.items():
        codec = latents.model
        where = f"latents.{key}.model"
        problems += model_problems(
            where, codec.family, codec.pretrained, options=codec.options, components=codec.components
        )
    return problems


MODES = {1: "grayscale", 3: "rgb"}  # preprocess.mode by the channels it makes


def network_model(pipeline: PipelineConfig, stage: str) -> ModelConfig | None:
    """The ``model:`` block that defines stage ``stage``'s network: its own, or, following ``model.init`` through
    earlier stages, the first with ``pretrained`` or starting from scratch; None from the promoted export."""
    seen = set()
    while stage in pipeline.stages and stage not in seen:
        seen.add(stage)
        model = pipeline.stages[stage].model
        if model.pretrained is not None or model.init == "scratch":
            return model
        stage = model.init
    return None


def _stage_channel_problems(
    name: str, stage: StageConfig, contract: ExecutionContract, pipeline: PipelineConfig
) -> list[str]:
    """The channels of the images a dataset-reading stage trains on, against its family's output codec."""
    from flowpost.core.models.folder_checks import codec_channels

    if stage.data is None or contract.acquisition is not Acquisition.DATASET:
        return []
    model = network_model(pipeline, name)
    if model is None:
        return []
    codec = codec_channels(model.family, model.pretrained, components=model.components, transformer=model.transformer)
    user = f"stage {name!r} trains on them through"
    return _channel_problems(pipeline, stage.data.dataset, f"stages.{name}.data.dataset", user, codec)


def _latent_channel_problems(pipeline: PipelineConfig) -> list[str]:
    """The channels of the images each latent cache encodes, against its family's VAE (a pixel-space family's
    identity codec takes any; the stages reading the cache are checked)."""
    from flowpost.core.models.folder_checks import codec_channels

    problems = []
    for key, latents in pipeline.latents.items():
        codec = latents.model
        if codec.pretrained is None:
            continue
        channels = codec_channels(codec.family, codec.pretrained, components=codec.components, transformer={})
        user = f"latent cache {key!r} encodes them with"
        problems += _channel_problems(pipeline, latents.dataset, f"latents.{key}.dataset", user, channels)
    return problems


def _channel_problems(
    pipeline: PipelineConfig, dataset_name: str, where: str, user: str, codec: Codec | None
) -> list[str]:
    """Why dataset ``dataset_name``'s images do not have the ``codec``'s channels (none when it is unknown)."""
    dataset = pipeline.datasets.get(dataset_name)
    if dataset is None or codec is None:
        return []
    channels = dataset.image_channels()
    if channels is None:
        return []
    wanted, what, _ = codec
    if channels == wanted:
        return []
    preprocessed = isinstance(dataset, CaptionedDataset)  # its channels are set by preprocess.mode
    mode = MODES.get(wanted)
    if mode is None:
        remedy = f"no preprocess.mode makes {wanted} channels; train with a model whose codec takes 1 or 3"
    elif not preprocessed:
        remedy = f"train on an image dataset with preprocess.mode: {mode}"
    else:
        remedy = f"set datasets.{dataset_name}.preprocess.mode: {mode}"
    if not preprocessed:
        source = dataset.source
        return [f"{where}: {dataset_name!r} ({source}) holds {channels}-channel images, and {user} {what}; {remedy}"]
    return [
        f"datasets.{dataset_name}.preprocess.mode: {dataset.preprocess.mode} makes {channels}-channel images, and "
        f"{user} {what}; {remedy}"
    ]


def pipeline_warnings(pipeline: PipelineConfig) -> list[str]:
    """What validates and runs but cannot work as meant, one ``path: message`` line each: an evaluation that
    cannot tell a better model from a hacked reward, and stages that cannot learn (groups of one sample, rewards
    of weight 0, LoRA ranks above the width of the layers they adapt)."""
    warnings = judge_reward_warnings(pipeline)
    for name, stage in pipeline.stages.items():
        warnings += _group_warnings(name, stage)
        warnings += _reward_weight_warnings(f"stages.{name}.rewards", stage.rewards, f"stage {name!r} cannot learn")
        warnings += _lora_rank_warnings(pipeline, name)
    for key, dataset in pipeline.datasets.items():
        if isinstance(dataset, SampledPairsDataset):
            where, outcome = f"datasets.{key}.sample.rewards", "every pair is a tie"
            warnings += _reward_weight_warnings(where, dataset.sample.rewards, outcome)
    return warnings


def _group_warnings(name: str, stage: StageConfig) -> list[str]:
    """A rewarded generating stage with groups of one sample: its advantages compare a sample with its group."""
    from flowpost.core.trainers.arguments import OnlineArguments

    arguments = stage.arguments()
    if arguments.execution_contract.feedback is not Feedback.RUNTIME_REWARD:
        return []
    if not isinstance(arguments, OnlineArguments) or arguments.group_size != 1:
        return []
    return [
        f"stages.{name}.train.group_size: 1 puts each prompt's sample in a group of its own, and trainer "
        f"{stage.trainer!r} learns from the reward differences inside a group (group-normalised advantages), so "
        "every advantage is 0 and the stage cannot learn; set group_size to 2 or more (e.g. 8)"
    ]


def _reward_weight_warnings(where: str, rewards: list[RewardConfig], outcome: str) -> list[str]:
    """Rewards of weight 0: each scores every sample and adds nothing; all of them: every total is 0."""
    if rewards and all(reward.weight == 0 for reward in rewards):
        return [
            f"{where}: every reward has weight 0, so every sample's total reward is 0 and {outcome}; give a reward "
            "a nonzero weight"
        ]
    return [
        f"{where}.{i}.weight: 0, so {reward.name!r} is computed for every sample and adds nothing to the total; "
        "give it a nonzero weight or remove it"
        for i, reward in enumerate(rewards)
        if reward.weight == 0
    ]


def _lora_rank_warnings(pipeline: PipelineConfig, name: str) -> list[str]:
    """A LoRA rank above the width of the narrowest layer it adapts: that adapter is no longer low rank."""
    from flowpost.core.models.folder_checks import smallest_lora_layer

    lora, model = pipeline.stages[name].model.lora, network_model(pipeline, name)
    if lora is None or model is None:
        return []
    smallest = smallest_lora_layer(
        model.family,
        model.pretrained,
        options=model.options,
        components=model.components,
        transformer=model.transformer,
        targets=lora.targets,
    )
    if smallest is None or lora.rank <= smallest[0]:
        return []
    width, layer = smallest
    return [
        f"stages.{name}.model.lora.rank: {lora.rank} is above the width {width} of the narrowest layer it adapts "
        f"({layer}), so the adapters are no longer low rank: the one on that layer holds more parameters than the "
        f"layer itself and learns nothing a rank of {width} would not; use a rank of at most {width} (e.g. 8 to 64)"
    ]


def _metric_problems(pipeline: PipelineConfig) -> list[str]:
    """Metric names no registry knows, plugins that cannot be loaded or lack a key, metrics reading the
    evaluation dataset's assets (``assets_dir``) where it writes none, and metrics comparing with held-out real
    images (``reads_reference``) on a prompt-files dataset."""
    from flowpost.core.evaluation.registry import ASSETS, metric_parameters, metric_problem, metric_reads_reference
    from flowpost.core.plugins import is_path

    evaluate = pipeline.evaluate
    dataset = pipeline.datasets[evaluate.dataset] if evaluate.dataset is not None else None
    assets = dataset is not None and dataset.WRITES_ASSETS
    problems = []
    for i, metric in enumerate(evaluate.metrics or []):
        where = f"evaluate.metrics.{i}"
        if problem := metric_problem(metric.name, where=where):
            problems.append(problem)
        elif is_path(metric.name) and metric.key is None:
            problems.append(
                f"{where}.key: metric {metric.name!r} is a class path, which cannot be its name in metrics.json; "
                "give it a key (e.g. key: sharpness)"
            )
        elif not assets and ASSETS not in metric.options and ASSETS in metric_parameters(metric.name, where=where):
            problems.append(
                f"{where}: {metric.name!r} reads the assets its dataset's acquisition writes ({ASSETS}), and the "
                f"source of evaluate.dataset {evaluate.dataset!r} writes none; evaluate on a dataset of the source "
                "it belongs to, or pick another metric"
            )
        elif isinstance(dataset, PromptFilesDataset) and metric_reads_reference(metric.name, where=where):
            problems.append(
                f"{where}: {metric.name!r} compares the samples with held-out real images, which prompt-files "
                f"dataset {evaluate.dataset!r} has none of; drop it, or evaluate on an image dataset with split.eval"
            )
    return problems


def _gate_problems(pipeline: PipelineConfig) -> list[str]:
    """Fills in the direction of each metric the promotion gate gives none: the metric's own. A metric that
    declares none needs one in the gate."""
    from flowpost.core.evaluation.registry import metric_direction

    gate = pipeline.export.promote if pipeline.export is not None else None
    if gate is None:
        return []
    evaluated = {metric.result_key: (i, metric.name) for i, metric in enumerate(pipeline.evaluate.metrics or [])}
    problems = []
    for key in [key for key, better in gate.metrics.items() if better is None]:
        position, metric = evaluated[key]
        gate.metrics[key] = metric_direction(metric, where=f"evaluate.metrics.{position}")
        if gate.metrics[key] is None:
            problems.append(
                f"export.promote.metrics.{key}: {metric!r} declares no direction; give it, e.g. "
                f"export.promote.metrics: {{{key}: higher}} (or lower)"
            )
    return problems


def _curve_problems(pipeline: PipelineConfig) -> list[str]:
    """``evaluate.every`` scores checkpoints: each evaluated stage fully fine-tunes one network, writes a
    checkpoint at every multiple of it and keeps them all."""
    from flowpost.core.trainers.registry import trainer_class

    every = pipeline.evaluate.every
    if every is None:
        return []
    problems = []
    for name in pipeline.evaluate.after:
        stage = pipeline.stages[name]
        train = stage.train
        if stage.model.lora is not None or trainer_class(stage.trainer).required_trainable_roles:
            problems.append(
                f"evaluate.every: stage {name!r} trains LoRA adapters or several roles, whose checkpoints are laid "
                "out unlike its final weights; curves score stages that fully fine-tune one network: evaluate "
                f"it at the end only (remove evaluate.every, or {name} from evaluate.after)"
            )
        cadence, where = int(train["checkpoint_every"]), f"stages.{name}.train"
        if not cadence:
            problems.append(
                f"evaluate.every: stage {name!r} writes no checkpoints to score; set {where}.checkpoint_every "
                f"(e.g. {every})"
            )
        elif every % cadence:
            problems.append(
                f"evaluate.every: {every} is not a multiple of {where}.checkpoint_every ({cadence}), so some scored "
                f"checkpoints would not exist; use a multiple of {cadence}"
            )
        if train.get("keep_last") is not None:
            problems.append(
                f"evaluate.every: {where}.keep_last ({train['keep_last']}) deletes the checkpoints the evaluation "
                "scores; remove keep_last (the default keeps every checkpoint)"
            )
    return problems


def _guard_problems(
    name: str, stage: StageConfig, arguments: TrainerArguments, datasets: dict[str, DatasetConfig]
) -> list[str]:
    """A guard's metrics no registry knows, a metric reading assets the dataset has none of, no cadence, no
    held-out prompts,
    or a judge that is the stage's own reward."""
    from flowpost.core.evaluation.registry import ASSETS, metric_direction, metric_parameters, metric_problem

    guard, where = stage.guard, f"stages.{name}.guard"
    if guard is None:
        return []
    problems = []
    dataset_name = stage.data.dataset if stage.data is not None else None
    dataset = datasets.get(dataset_name) if dataset_name is not None else None
    assets = dataset is not None and dataset.WRITES_ASSETS
    named = [(f"{where}.metric", guard.metric.name, guard.metric.options)] if guard.metric is not None else []
    named += [(f"{where}.bounds.{key}", key, band.options) for key, band in guard.bounds.items()]
    for path, metric, options in named:
        if problem := metric_problem(metric, where=path):
            problems.append(problem)
        elif not assets and ASSETS not in options and ASSETS in metric_parameters(metric, where=path):
            problems.append(
                f"{path}: {metric!r} reads the assets its dataset's acquisition writes ({ASSETS}), and the stage's "
                "dataset has none; guard a stage trained on a dataset of the source it belongs to"
            )
        elif path == f"{where}.metric" and guard.better is None:
            guard.better = metric_direction(metric, where=path)
            if guard.better is None:
                problems.append(f"{where}.better: {metric!r} declares no direction; give better: higher or lower")
    if guard.every is None and not arguments.checkpoint_every:
        problems.append(f"{where}.every: set it, or train.checkpoint_every, to say when the guard checks")
    if dataset is not None and not dataset.holds_out():
        problems.append(
            f"{where}: the guard samples the held-out prompts of {dataset_name!r}, which holds none; "
            f"set datasets.{dataset_name}.split.eval"
        )
    if guard.metric is not None and guard.metric.name in {reward.name for reward in stage.rewards}:
        problems.append(
            f"{where}.metric: {guard.metric.name!r} is the stage's reward, which rises while it is hacked; "
            "guard with a metric the stage is not trained on"
        )
    return problems


def judge_reward_warnings(pipeline: PipelineConfig) -> list[str]:
    """One warning per evaluated stage trained on the reward that is also the headline metric
    (``evaluate.metrics.0``): a stage is judged by something it was not trained on."""
    metrics = pipeline.evaluate.metrics or []
    if not metrics:
        return []
    headline = metrics[0]
    return [
        f"stages.{name}.rewards.{i}: stage {name!r} is trained on {reward.name!r}, which is also the headline "
        f"evaluation metric (evaluate.metrics.0), so the evaluation cannot tell a better model from a hacked "
        f"reward; list a metric the stage is not trained on first"
        for name in pipeline.evaluate.after
        for i, reward in enumerate(pipeline.stages[name].rewards)
        if reward.name == headline.name
    ]


def _stage_problems(
    name: str, stage: StageConfig, contract: ExecutionContract, datasets: dict[str, DatasetConfig]
) -> list[str]:
    """What a stage lacks for its trainer's contract, or names that no registry knows."""
    from flowpost.core.models.registry import FAMILY_REGISTRY
    from flowpost.core.rewards.base import compares_groups
    from flowpost.core.rewards.registry import REWARD_REGISTRY

    problems = []
    if problem := FAMILY_REGISTRY.problem(stage.model.family, where=f"stages.{name}.model.family"):
        problems.append(problem)
    if stage.data is None:
        problems.append(f"stages.{name}.data: trainer {stage.trainer!r} needs {{dataset, conditions}}")
    if stage.data is not None and contract.acquisition is Acquisition.DATASET:
        if stage.data.prompts:
            problems.append(f"stages.{name}.data.prompts: trainer {stage.trainer!r} reads a dataset, not prompts")
        dataset = datasets.get(stage.data.dataset)
        if isinstance(dataset, PromptFilesDataset):
            problems.append(
                f"stages.{name}.data.dataset: trainer {stage.trainer!r} trains on images, and "
                f"{stage.data.dataset!r} holds prompts only"
            )
    if contract.feedback is Feedback.RUNTIME_REWARD and not stage.rewards:
        problems.append(f"stages.{name}.rewards: trainer {stage.trainer!r} needs at least one reward")
    if contract.feedback is Feedback.NONE and stage.rewards:
        problems.append(f"stages.{name}.rewards: trainer {stage.trainer!r} uses no reward; remove the section")
    for i, reward in enumerate(stage.rewards):
        if problem := REWARD_REGISTRY.problem(reward.name, where=f"stages.{name}.rewards.{i}.name"):
            problems.append(problem)
        elif stage.train.get("overlap_rewards") and compares_groups(REWARD_REGISTRY.load(reward.name, where=name)):
            problems.append(
                f"stages.{name}.train.overlap_rewards: scores each forward batch as it is sampled, and reward "
                f"{reward.name!r} (stages.{name}.rewards.{i}) compares whole groups; set overlap_rewards: false"
            )
    processes = stage.launch.num_processes
    for key in ("batch_size", "rollout_batch_size", "train_batch_size"):
        size = stage.train.get(key)
        if isinstance(size, int) and size % processes:
            problems.append(
                f"stages.{name}.train.{key}: {size} does not split evenly over launch.num_processes={processes}"
            )
    return problems


def _distillation_problems(
    name: str, stage: StageConfig, arguments: TrainerArguments, datasets: dict[str, DatasetConfig]
) -> list[str]:
    """A distillation stage without a teacher (its init weights), and trajectories read by a trainer
    that does not train on them, or the other way round."""
    problems = []
    if arguments.paradigm is Paradigm.DISTILLATION and stage.model.init == "scratch":
        problems.append(
            f"stages.{name}.model.init: trainer {stage.trainer!r} distils the weights the stage starts from; "
            "set it to a trained stage (the teacher)"
        )
    dataset = datasets.get(stage.data.dataset) if stage.data is not None else None
    if dataset is None or arguments.execution_contract.acquisition is not Acquisition.DATASET:
        return problems
    reads = arguments.reads_trajectories
    if reads != isinstance(dataset, TrajectoriesDataset):
        problems.append(
            f"stages.{name}.data.dataset: trainer {stage.trainer!r} trains on a {TRAJECTORIES!r} dataset"
            if reads
            else f"stages.{name}.data.dataset: {stage.data.dataset!r} holds teacher trajectories, which only "
            "trainer 'kd' trains on"
        )
    return problems


def _sampling_problems(name: str, stage: StageConfig, paradigm: Paradigm) -> list[str]:
    """A coupled trainer scores transition densities: every trainable step needs a positive, bounded std.

    Checked here on the generic grid (``inference_sigmas`` at ``model.shift``), before any model is read;
    the rollout engine checks every stage again on its family's own scheduler grid at load
    (``core/sampling/checks.py``).
    """
    if paradigm is not Paradigm.COUPLED:
        return []
    from flowpost.core.sampling.checks import sde_step_problems
    from flowpost.core.sampling.schedules import inference_sigmas

    sampling = stage.sampling or SamplingConfig()
    sigmas = inference_sigmas(sampling.steps, shift=stage.model.shift)
    return [
        f"stages.{name}.sampling: trainer {stage.trainer!r} trains on SDE transition densities, and {problem}"
        for problem in sde_step_problems(sigmas, sampling, needs_noise=True)
    ]


ROLE_OPTIMIZER_FIELDS = tuple(AdamWSettings.model_fields)  # optimizers.<role> holds them


def _optimizer_problems(name: str, stage: StageConfig, arguments: TrainerArguments) -> list[str]:
    """``adamw8bit``, in ``train.optimizer`` or an ``optimizers.<role>.name``, only where it runs and resumes."""
    from flowpost.core.trainers.eight_bit import eight_bit_problems

    chosen = [f"stages.{name}.optimizers.{role}.name" for role, c in stage.optimizers.items() if c.name == "adamw8bit"]
    if arguments.optimizer == "adamw8bit":
        chosen.append(f"stages.{name}.train.optimizer")
    problems = eight_bit_problems(stage.launch.backend, stage.launch.num_processes)
    return [f"{where}: {problem}" for where in chosen for problem in problems]


def _role_problems(name: str, stage: StageConfig, arguments: TrainerArguments) -> list[str]:
    """``optimizers:`` names each trainable role of the trainer once, never a frozen snapshot, and
    holds what ``train:``'s optimizer fields would; Muon runs only where whole matrices live on every
    rank; ZeRO-2 steps one optimizer."""
    from flowpost.core.snapshots import SNAPSHOT_NAMES
    from flowpost.core.trainers.optimizers import MUON_BACKENDS
    from flowpost.core.trainers.registry import trainer_class

    roles = trainer_class(stage.trainer).required_trainable_roles
    where = f"stages.{name}.optimizers"
    if not roles:
        if stage.optimizers:
            return [f"{where}: trainer {stage.trainer!r} trains one network; set train.lr and remove optimizers"]
        return []
    problems = []
    for key in stage.optimizers:
        if key in SNAPSHOT_NAMES:
            problems.append(
                f"{where}.{key}: {key!r} is frozen weights (a snapshot the trainer captures), not a trainable "
                f"role; the roles of {stage.trainer!r} are {', '.join(roles)}"
            )
        elif key not in roles:
            problems.append(f"{where}.{key}: " + unknown_name("role", key, roles))
    problems += [
        f"{where}.{role}: trainer {stage.trainer!r} trains role {role!r}; give it an optimizer (e.g. {{lr: 1.0e-5}})"
        for role in roles
        if role not in stage.optimizers
    ]
    fields = type(arguments).model_fields
    problems += [
        f"stages.{name}.train.{key}: trainer {stage.trainer!r} has one optimizer per role; set it in {where}.<role>"
        for key in ROLE_OPTIMIZER_FIELDS
        if getattr(arguments, key) != fields[key].default
    ]
    if arguments.optimizer != fields["optimizer"].default:
        problems.append(
            f"stages.{name}.train.optimizer: trainer {stage.trainer!r} has one optimizer per role; name it in "
            f"{where}.<role>.name"
        )
    backend, processes = stage.launch.backend, stage.launch.num_processes
    if processes > 1 and backend == "deepspeed-zero2":
        problems.append(
            f"stages.{name}.launch.backend: deepspeed-zero2 steps one optimizer and {stage.trainer!r} has one "
            "per role; use ddp or fsdp2"
        )
    for role, config in stage.optimizers.items():
        if config.name == "muon" and processes > 1 and backend not in MUON_BACKENDS:
            problems.append(
                f"{where}.{role}.name: torch.optim.Muon orthogonalises whole matrices and cannot step {backend} "
                "shards; use launch.backend ddp or name: adamw"
            )
    return problems


def load_pipeline(
    path: str | Path | None = None, overrides: list[str] | None = None, *, warnings: list[str] | None = None
) -> PipelineConfig:
    """Load, override and validate a pipeline file (the embedded default when ``path`` is None); ``warnings``
    collects its warnings (None logs them)."""
    file = Path(path) if path is not None else default_pipeline_path()
    data = apply_overrides(read_yaml(file), overrides or [])
    return validate_pipeline(data, source=str(file), warnings=warnings)


def pipeline_to_dict(pipeline: PipelineConfig) -> dict[str, Any]:
    """The resolved pipeline as plain data (the form `config show` prints and DVC params hold)."""
    return pipeline.model_dump(mode="json", by_alias=True)


def _format_errors(exc: ValidationError, *, prefix: str) -> str:
    lines = []
    for error in exc.errors():
        path = (prefix + ".".join(str(part) for part in error["loc"])).rstrip(".")
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key; remove it or check its spelling"
        elif error["type"] == "finite_number":
            message = f"{error.get('input')} is not a finite number; give a finite value"
        elif error["type"] == "literal_error":
            message = f"{message} (got {error.get('input')!r})"
        lines.append(f"{path}: {message}" if path else message)
    return "invalid configuration:\n  " + "\n  ".join(lines)
