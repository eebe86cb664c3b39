"""The per-rank entry point of a training stage: ``python -m flowpost.stage STAGE.json``.

The composition root of a stage process: it wires the data layer (``load_stage_inputs``) and the
training core (model, callbacks, rewards, trainer). Tasks start it as a process, or import
``build_trainer`` from it; nothing in ``data/`` or ``core/`` imports it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import torch

from flowpost.core.callbacks.base import Callback
from flowpost.core.callbacks.ema import EMACallback
from flowpost.core.callbacks.grad_clip import GradClipCallback
from flowpost.core.callbacks.tracking import RunIdentity, TrackingCallback
from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.config.schema.evaluation import GuardConfig
from flowpost.core.config.schema.models import ModelConfig
from flowpost.core.config.schema.rewards import RewardConfig
from flowpost.core.config.schema.stages import CallbacksConfig, StageConfig
from flowpost.core.distributed import leave_process_group
from flowpost.core.evaluation.guard import Band, HeldOut, Judge, StageGuard
from flowpost.core.evaluation.plan import EvalPlan
from flowpost.core.evaluation.registry import build_metric
from flowpost.core.evaluation.validation import ValidationGrid
from flowpost.core.logging import get_logger
from flowpost.core.models.attention import set_attention
from flowpost.core.models.base import ModelAdapter
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.quantize import quantize_frozen
from flowpost.core.models.registry import adapter_class, load_adapter
from flowpost.core.models.text_encoders import same_encoder
from flowpost.core.process_group import launch_ranks, rank_log, record_rank_failure
from flowpost.core.progress import BudgetUnit, TrainingProgress
from flowpost.core.rewards.combine import WeightedRewards
from flowpost.core.rewards.frames import FrameSelection
from flowpost.core.rewards.metadata_fields import check_metadata_fields, metadata_fields
from flowpost.core.rewards.registry import REWARD_REGISTRY, build_reward, reward_parameters
from flowpost.core.trainers.base import BaseTrainer
from flowpost.core.trainers.inputs import StageInputs
from flowpost.core.trainers.registry import trainer_class
from flowpost.core.trainers.spec import PARENT_PID_ENV, StageSpec
from flowpost.core.trainers.stop import StageStopped, stop_on_sigterm
from flowpost.data.eval_split import read_eval_split
from flowpost.data.stage_inputs import load_stage_inputs
from flowpost.errors import FlowpostError

log = get_logger(__name__)
PR_SET_PDEATHSIG = 1
PARENT_GONE = 3  # exit code when the orchestrator died before this process could follow it
SMOKE_GUARD_SAMPLES = 20  # a smoke run's guard checks this many samples at most
ENTRY = "flowpost.stage"  # this module, as ``python -m`` and torchrun start it


def build_callbacks(config: CallbacksConfig, spec: StageSpec, *, trainer: str, family: str) -> dict[str, Callback]:
    """Callbacks by their ``callbacks:`` key, in a fixed order: clipping, EMA, tracking (whose runs name the
    stage's ``trainer`` and model ``family``)."""
    callbacks: dict[str, Callback] = {}
    if config.grad_clip is not None:
        callbacks["grad_clip"] = GradClipCallback(max_norm=config.grad_clip.max_norm)
    if config.ema is not None:
        callbacks["ema"] = EMACallback(**config.ema.model_dump())
    if config.trackers:
        identity = RunIdentity(
            pipeline=spec.pipeline or spec.stage,
            stage=spec.stage,
            trainer=trainer,
            family=family,
            output_dir=Path(spec.output_dir),
        )
        callbacks["trackers"] = TrackingCallback(list(config.trackers), Path(spec.output_dir) / "logs", identity)
    return callbacks


def build_validation(config: CallbacksConfig, spec: StageSpec, inputs: StageInputs) -> ValidationGrid | None:
    """The periodic validation grid of ``callbacks.validation`` (None when absent)."""
    validation = config.validation
    if validation is None:
        return None
    conditions = inputs.require("conditions", where=f"stages.{spec.stage}.callbacks.validation")
    return ValidationGrid(
        every=validation.every,
        prompts=validation.prompts,
        conditions=conditions.lookup(validation.prompts),
        negative=conditions.lookup([NULL_PROMPT]),
        samples_per_prompt=validation.samples_per_prompt,
        steps=validation.steps,
        guidance=validation.guidance,
        out_dir=Path(spec.output_dir) / "validation",
    )


def build_guard(
    config: GuardConfig | None, spec: StageSpec, inputs: StageInputs, *, every: int, unit: BudgetUnit
) -> StageGuard | None:
    """The stage's guard (None without ``guard:``): the held-out split of the stage's dataset, sampled and
    scored every ``guard.every`` budget units (``every`` when unset; ``unit`` names them) with metrics from the
    evaluation registry."""
    if config is None:
        return None
    where = f"stages.{spec.stage}.guard"
    if config.metric is not None and config.better is None:  # the pipeline fills it in when it loads
        raise FlowpostError("the judge has no direction; give better: higher or lower", where=f"{where}.better")
    if spec.dataset_dir is None:
        raise FlowpostError("a guard samples the held-out prompts of the stage's data.dataset; set data", where=where)
    dataset_dir = Path(spec.dataset_dir)
    split = read_eval_split(dataset_dir, where=where)
    assets = dataset_dir / "assets" if (dataset_dir / "assets").is_dir() else None
    conditions = inputs.require("conditions", where=where)
    judge = None
    if config.metric is not None and config.max_drop is not None:
        metric = build_metric(
            config.metric.name, options=config.metric.options, where=f"{where}.metric", assets_dir=assets
        )
        judge = Judge(key=config.metric.result_key, metric=metric, max_drop=config.max_drop, better=config.better)
    bounds = {
        name: (
            build_metric(name, options=band.options, where=f"{where}.bounds.{name}", assets_dir=assets),
            Band(min=band.min, max=band.max, max_change=band.max_change),
        )
        for name, band in config.bounds.items()
    }
    plan = EvalPlan(
        prompts=split.prompts,
        samples=min(config.samples, SMOKE_GUARD_SAMPLES) if spec.smoke else config.samples,
        steps=config.steps,
        guidance=config.guidance,
        seed=config.seed,
        batch_size=config.batch_size,
    )
    held_out = HeldOut(
        prompts=split.prompts,
        metadata=split.metadata,
        conditions=conditions.lookup(split.prompts),
        negative=conditions.lookup([NULL_PROMPT]),
        reference=split.reference,
    )
    return StageGuard(
        judge=judge,
        bounds=bounds,
        every=config.every or every,
        unit=unit,
        plan=plan,
        held_out=held_out,
        weights=config.weights,
        where=where,
    )


def build_adapter(stage: StageConfig, spec: StageSpec) -> ModelAdapter:
    """A fresh model (seeded), the ``model.pretrained`` pipeline or the stage named by ``model.init``,
    with its attention backend, and a quantized base, LoRA, mixed precision and compilation when configured.

    The encoder length of the stage's condition cache (``spec.extra["encoder"]``) is recorded on
    the adapter, so the saved model encodes new prompts the way it was trained.
    """
    model = stage.model
    if spec.init_from is not None:
        adapter = load_adapter(spec.init_from)
    else:
        adapter = starting_adapter(model, seed=spec.seed, where=f"stages.{spec.stage}")
    encoder = spec.extra.get("encoder") or {}
    encoder_at = f"stages.{spec.stage}.data.conditions"
    if not same_encoder(encoder.get("name", adapter.encoder_name), adapter.encoder_name, where=encoder_at):
        model_at = model.pretrained or spec.init_from or f"family {model.family!r}"
        raise FlowpostError(
            f"the model ({model_at}) reads {adapter.encoder_name!r} conditions, but the cache "
            f"{spec.conditions_dir} holds {encoder['name']!r} ones ({encoder.get('pretrained', 'its encoder')}); "
            "point data.conditions at a cache of the stage's family",
            where=encoder_at,
        )
    if encoder.get("max_length") is not None:
        adapter.encoder_max_length = int(encoder["max_length"])
    set_attention(adapter.module(), model.attention, where=f"stages.{spec.stage}.model.attention")
    if stage.launch.mixed_precision == "bf16":
        adapter.compute_dtype = torch.bfloat16
    if model.quantize != "none":  # before the adapters: every pass runs the same quantized base
        quantize_frozen(adapter.module(), model.quantize)
    lora = stage.model.lora
    if lora is not None:
        with torch.random.fork_rng(devices=[]):  # adapters drawn from the seed alone, whatever ran before
            torch.manual_seed(spec.seed)
            adapter.add_lora(rank=lora.rank, alpha=lora.alpha or float(lora.rank), targets=lora.targets)
    if model.compile is not None:
        where = f"stages.{spec.stage}.model.compile"
        adapter.compile_networks(regional=model.compile.regional, options=model.compile.options(), where=where)
    return adapter


def starting_adapter(model: ModelConfig, *, seed: int, where: str) -> ModelAdapter:
    """What a stage that starts from no stage starts from: the ``model.pretrained`` pipeline, or a fresh model of
    ``model.family`` drawn from ``seed``."""
    cls = adapter_class(model.family, where=f"{where}.model.family")
    if model.pretrained is not None:
        source = PretrainedSource(
            model.pretrained, model.revision, model.variant, model.torch_dtype, model.components or {}
        )
        return pipeline_adapter(cls, source, model.options, where=where)
    return cls.from_scratch(seed=seed, shift=model.shift, overrides=model.transformer)


def pipeline_adapter(cls: type[ModelAdapter], source: PretrainedSource, options: dict, *, where: str) -> ModelAdapter:
    """``cls.from_pipeline`` with the family's ``model.options``; an unknown or bad option names its path."""
    if unknown := sorted(set(options) - set(cls.options)):
        accepted = ", ".join(cls.options) or "none"
        raise FlowpostError(
            f"family {cls.family!r} has no option {', '.join(unknown)}; accepted: {accepted}",
            where=f"{where}.model.options",
        )
    try:
        return cls.from_pipeline(source, **options)
    except FlowpostError as exc:
        if exc.where is None or not exc.where.startswith("model."):
            raise
        raise FlowpostError(str(exc).removeprefix(f"{exc.where}: "), where=f"{where}.{exc.where}") from None


def build_rewards(configs: list[RewardConfig], spec: StageSpec, inputs: StageInputs) -> WeightedRewards | None:
    """The stage's weighted reward sum; scorers that take ``assets_dir`` get the dataset's assets; each scores
    video through its ``frames`` choice. A prompt without a metadata field a reward reads is an error."""
    if not configs:
        return None
    components = []
    for i, config in enumerate(configs):
        where = f"stages.{spec.stage}.rewards.{i}"
        if fields := metadata_fields(REWARD_REGISTRY.load(config.name, where=f"{where}.name")):
            check_metadata_fields(config.name, fields, inputs.prompts, dataset=_prompt_dataset(spec), where=where)
        options = dict(config.options)
        if inputs.assets_dir is not None and "assets_dir" in reward_parameters(config.name, where=where):
            options.setdefault("assets_dir", inputs.assets_dir)
        reward = build_reward(config.name, options=options, where=where)
        selected = FrameSelection(reward, frames=config.frames, sampled_frames=config.sampled_frames, where=where)
        components.append((selected, config.weight))
    return WeightedRewards(components, where=f"stages.{spec.stage}.rewards")


def _prompt_dataset(spec: StageSpec) -> str:
    """The name of the dataset whose prompts the stage rolls out: ``data.prompts``, else ``data.dataset``."""
    data = spec.config.get("data") or {}
    return str(data.get("prompts") or data.get("dataset") or spec.prompts_dir or spec.dataset_dir)


def run_stage(spec: StageSpec) -> TrainingProgress:
    """Validate, build and run one stage in this process."""
    return build_trainer(spec).start()


def build_trainer(spec: StageSpec) -> BaseTrainer:
    """The stage's trainer with its model, data, callbacks and rewards, ready to ``start()``."""
    stage = StageConfig.model_validate(spec.config)
    args = stage.arguments(smoke=spec.smoke)
    trainer_cls = trainer_class(stage.trainer, where=f"stages.{spec.stage}.trainer")  # before any model loads
    inputs = load_stage_inputs(spec)
    adapter = build_adapter(stage, spec)
    rewards = build_rewards(stage.rewards, spec, inputs)
    return trainer_cls(
        spec=spec,
        args=args,
        adapter=adapter,
        inputs=inputs,
        callbacks=build_callbacks(stage.callbacks, spec, trainer=stage.trainer, family=stage.model.family),
        validation=build_validation(stage.callbacks, spec, inputs),
        guard=build_guard(stage.guard, spec, inputs, every=args.checkpoint_every, unit=args.budget_unit),
        sampling=stage.sampling,
        **({"rewards": rewards} if rewards is not None else {}),
        **({"optimizers": stage.optimizers} if stage.optimizers else {}),
    )


def follow_parent() -> bool:
    """Tie this process's life to the orchestrator named by ``FLOWPOST_PARENT_PID``.

    On Linux, ask for SIGTERM when the parent exits; then check the parent is still the one
    that started us (it may have died before the request). False means it is gone. Without the
    variable (a stage started by hand), nothing is done.
    """
    expected = os.environ.pop(PARENT_PID_ENV, None)
    if not expected:
        return True
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    return os.getppid() == int(expected)


def _redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (file descriptors included) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    """One stage process: a rank (single-process, or started by torchrun) or the ranks' launcher.

    SIGTERM stops a rank at its next budget-unit boundary with a checkpoint (exit 143).
    """
    if not follow_parent():
        print("error: the orchestrating process has exited; not starting the stage", file=sys.stderr)
        return PARENT_GONE
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m {ENTRY} STAGE.json", file=sys.stderr)
        return 2
    spec = StageSpec.read(argv[0])
    num_processes = spec.num_processes
    started_by_torchrun = "RANK" in os.environ
    if num_processes > 1 and not started_by_torchrun:
        return launch_ranks(ENTRY, argv[0], spec.output_dir, num_processes)
    rank = int(os.environ.get("RANK", 0))
    if started_by_torchrun:
        _redirect_output(rank_log(spec.output_dir, rank))
    try:
        with stop_on_sigterm():
            progress = run_stage(spec)
    except StageStopped as stop:
        print(f"{stop}; it resumes from there on the next run", file=sys.stderr)
        return 128 + stop.signum
    except BaseException as exc:
        record_rank_failure(spec.output_dir, rank, exc)
        if not isinstance(exc, FlowpostError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1
    log.info("stage finished at %s", progress)
    leave_process_group()
    if started_by_torchrun:
        _exit_without_teardown()
    return 0


def _exit_without_teardown() -> None:
    """End a finished rank now, skipping interpreter and C++ static teardown.

    Everything the rank writes is atomic and already on disk; what is left at exit are the
    communication libraries' worker threads, whose destruction can abort the process
    (``terminate called without an active exception``) and fail a stage that succeeded.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
