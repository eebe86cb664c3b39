"""BaseTrainer: the one training loop. Algorithms implement hooks; they never override ``start``.

Two trainer types fix what a cycle is: ``DatasetTrainer`` (a pass over a finite dataset) and
``GenerationTrainer`` (a rollout iteration). The loop dispatches on the type; collaborators hold
the rest: the parallel layout, the checkpoint manager, the callbacks, the event log.
"""

from __future__ import annotations

import random
import signal
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from flowpost.core.callbacks.base import Callback, CallbackList
from flowpost.core.contracts import Acquisition, ExecutionContract, Paradigm
from flowpost.core.distributed import any_over_ranks, mean_over_ranks
from flowpost.core.evaluation.guard import GUARD_FILE, StageGuard
from flowpost.core.evaluation.validation import ValidationGrid
from flowpost.core.events import DoneEvent, EventLog, GuardEvent, ProgressEvent, StartEvent, resume_warning
from flowpost.core.io import write_json_atomic
from flowpost.core.ledger import COST_FILE, CostLedger
from flowpost.core.logging import get_logger
from flowpost.core.models.base import ModelAdapter
from flowpost.core.models.precision import upcast_trainable
from flowpost.core.parallel import parallel_layout
from flowpost.core.progress import TrainingProgress, describe_position
from flowpost.core.residency import Residency
from flowpost.core.roles import role_problems
from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.snapshots import SNAPSHOT_NAMES, Snapshot
from flowpost.core.trainers.arguments import TrainerArguments
from flowpost.core.trainers.bad_steps import BadSteps, step_is_finite
from flowpost.core.trainers.checkpoints import CheckpointManager, Resumed
from flowpost.core.trainers.eight_bit import check_eight_bit
from flowpost.core.trainers.inputs import StageInputs
from flowpost.core.trainers.objective import Metrics, Objective, to_host
from flowpost.core.trainers.optimizers import (
    OptimizerConfig,
    RoleOptimizer,
    adamw,
    build_role_optimizer,
    check_role_optimizers,
)
from flowpost.core.trainers.spec import StageSpec
from flowpost.core.trainers.stop import GuardFired, StageStopped, stop_requested
from flowpost.errors import FlowpostError

log = get_logger(__name__)


class BaseTrainer(ABC):
    """Owns seeding, resume, the optimizer, cadences and callbacks; a trainer type owns the cycle.

    A concrete trainer names its arguments class once (``Arguments``); the execution contract and
    paradigm are the arguments class' and are copied onto the trainer class at definition.

    A trainer with several live networks declares them as ordered ``required_trainable_roles``
    (the first owns the base weights and the loop's ``optimizer_step``); each is a component
    variant with its own entry in the stage's ``optimizers:``.

    ``captured_snapshots`` names each snapshot ``setup`` captures with the ``train:`` field that switches it
    on (None: always): ``snapshots_held(args)``, which the memory preflight counts (the EMA callback's comes
    on top). A snapshot ``setup`` captures without declaring it fails the build.
    """

    required_trainable_roles: ClassVar[tuple[str, ...]] = ()
    captured_snapshots: ClassVar[Mapping[Snapshot, str | None]] = {}

    Arguments: ClassVar[type[TrainerArguments]]
    acquisition: ClassVar[Acquisition]  # fixed by the trainer type
    arguments_base: ClassVar[type[TrainerArguments]]  # fixed by the trainer type
    execution_contract: ClassVar[ExecutionContract]
    paradigm: ClassVar[Paradigm]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "execution_contract" in cls.__dict__ or "paradigm" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: declare execution_contract and paradigm on its Arguments class only")
        if problems := cls._snapshot_problems():
            raise TypeError(f"{cls.__name__}.captured_snapshots: {'; '.join(problems)}")
        arguments = cls.__dict__.get("Arguments")
        if arguments is None:
            return
        base = getattr(cls, "arguments_base", None)
        if base is None or not issubclass(arguments, base):
            raise TypeError(f"{cls.__name__}.Arguments must subclass {getattr(base, '__name__', 'a trainer type')}")
        contract = getattr(arguments, "execution_contract", None)
        paradigm = getattr(arguments, "paradigm", None)
        if contract is None or paradigm is None:
            raise TypeError(f"{arguments.__name__} must declare execution_contract and paradigm")
        if contract.acquisition is not cls.acquisition:
            raise TypeError(
                f"{cls.__name__} is a {cls.acquisition} trainer but {arguments.__name__} "
                f"declares the {contract} contract"
            )
        cls.execution_contract = contract
        cls.paradigm = paradigm
        if cls.required_trainable_roles and (problems := role_problems(cls.required_trainable_roles)):
            raise TypeError(f"{cls.__name__}.required_trainable_roles: {'; '.join(problems)}")

    @classmethod
    def _snapshot_problems(cls) -> list[str]:
        """Why ``captured_snapshots`` is no declaration: a key that is no ``Snapshot``, or a switch that is no
        field of ``Arguments`` (checked once the class has one)."""
        arguments = getattr(cls, "Arguments", None)
        problems = []
        for snapshot, switch in cls.captured_snapshots.items():
            if not isinstance(snapshot, Snapshot):
                problems.append(f"{snapshot!r} is no Snapshot; name it by a member of flowpost.core.snapshots.Snapshot")
            elif switch is not None and arguments is not None and switch not in arguments.model_fields:
                problems.append(f"{snapshot.value!r} is switched on by {switch!r}, no field of {arguments.__name__}")
        return problems

    @classmethod
    def snapshots_held(cls, args: TrainerArguments) -> frozenset[Snapshot]:
        """The snapshots the trainer captures under ``args``: those always held and those whose switch is set."""
        return frozenset(
            snapshot for snapshot, switch in cls.captured_snapshots.items() if switch is None or getattr(args, switch)
        )

    def __init__(
        self,
        *,
        spec: StageSpec,
        args: TrainerArguments,
        adapter: ModelAdapter,
        inputs: StageInputs | None = None,
        callbacks: dict[str, Callback] | None = None,
        validation: ValidationGrid | None = None,
        guard: StageGuard | None = None,
        sampling: SamplingConfig | None = None,
        accelerator: Any | None = None,
        optimizers: dict[str, OptimizerConfig] | None = None,
    ) -> None:
        if not isinstance(args, self.Arguments):
            raise FlowpostError(
                f"trainer {type(self).__name__} takes {self.Arguments.__name__}, not {type(args).__name__}",
                where=f"stages.{spec.stage}.train",
            )
        from accelerate import Accelerator

        self.spec = spec
        self.stage = spec.stage
        self.args = args
        self.adapter = adapter
        self.inputs = inputs or StageInputs()
        self.sampling = sampling or SamplingConfig()
        self.output_dir = Path(spec.output_dir)
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.callbacks = CallbackList(callbacks or {})
        self.validation = validation
        self.guard = guard
        self.progress = TrainingProgress()
        self.events = EventLog(
            self.output_dir / "events.jsonl", stage=self.stage, enabled=self.accelerator.is_main_process
        )
        self.parallel = parallel_layout(spec.launch.get("backend", "ddp"), self.accelerator.num_processes)
        self.cycle_metrics: dict[str, float] = {}  # the current cycle's rewards: every step's trackers see them
        self.bad_steps = BadSteps(args.max_bad_steps)
        self.cost: dict[str, Any] | None = None  # the ledger's summary once the stage has ended
        self.ledger = CostLedger(
            self.accelerator.device,
            world_size=self.accelerator.num_processes,
            sample_kind="generated" if self.acquisition is Acquisition.GENERATION else "training examples",
            frames=int(getattr(adapter, "num_frames", 1)),  # a video family's frames per sample
        )
        self.residency = Residency(self.accelerator.device)  # offloaded networks, placed at each phase boundary
        offload = set(spec.offload)
        adapter.snapshots.keep_on_host(sorted(offload & SNAPSHOT_NAMES), self.accelerator.device)
        if "vae" in offload:
            self.residency.add("vae", self._loaded_codec, self.codec_phases())
        roles = self.required_trainable_roles
        if roles:
            check_role_optimizers(
                roles, optimizers or {}, self.parallel.name, self.accelerator.num_processes, stage=spec.stage
            )
            adapter.add_component_variants(roles)  # before the layout prepares (and wraps) anything
        upcast_trainable(adapter.trainable_network())  # fp32 weights and optimizer state, whatever the base's dtype
        model = self.parallel.prepare(adapter, self.accelerator.device)
        before = set(adapter.snapshots.names())
        self.check_ranks()
        self.setup()
        self._check_snapshots_are_not_roles()
        self._check_snapshots_are_declared(set(adapter.snapshots.names()) - before)
        model.train()
        self.model = model  # never wrapped: the layout synchronises gradients (flowpost.core.parallel)
        self.roles: dict[str, RoleOptimizer] = {}
        if roles:
            assert optimizers is not None
            variants = adapter.variants
            self.roles = {
                role: build_role_optimizer(role, variants.named_parameters(role), optimizers[role], stage=spec.stage)
                for role in roles
            }
            first = self.roles[roles[0]]
            self.trainable, self.optimizer, self.scheduler = first.parameters, first, first.scheduler
        else:
            self.trainable = [p for p in model.parameters() if p.requires_grad]
            where = f"stages.{self.stage}.train.optimizer"
            if args.optimizer == "adamw8bit":
                check_eight_bit(self.parallel.name, self.accelerator.num_processes, where=where)
            optimizer = adamw(self.trainable, args, eight_bit=args.optimizer == "adamw8bit", where=where)
            warmup = args.warmup_steps
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
            )
            self.optimizer = self.parallel.prepare_optimizer(model, optimizer, self.accelerator)
        self.checkpoints = CheckpointManager(
            output_dir=self.output_dir,
            accelerator=self.accelerator,
            adapter=adapter,
            parallel=self.parallel,
            model=model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            callbacks=self.callbacks,
            events=self.events,
            keep_last=args.keep_last,
            roles=dict(list(self.roles.items())[1:]),  # the first role's is ``optimizer``
            guard=guard,
            ledger=self.ledger,
        )

    def _check_snapshots_are_not_roles(self) -> None:
        clash = sorted(set(self.adapter.snapshots.names()) & set(self.required_trainable_roles))
        if clash:
            raise FlowpostError(
                f"{', '.join(map(repr, clash))} is a live trainable role of {type(self).__name__}; a snapshot "
                "(frozen weights) needs a name of its own",
                where=f"stages.{self.stage}.trainer",
            )

    def _check_snapshots_are_declared(self, captured: set[str]) -> None:
        undeclared = sorted(map(str, captured - self.snapshots_held(self.args)))
        if undeclared:
            raise FlowpostError(
                f"{type(self).__name__}.setup captured the snapshot(s) {', '.join(undeclared)}, which its "
                "captured_snapshots does not declare under these arguments; declare each, so that the memory "
                "preflight counts it",
                where=f"stages.{self.stage}.trainer",
            )

    def _loaded_codec(self) -> list[torch.nn.Module]:
        codec = self.adapter.loaded_codec()
        return [] if codec is None else [codec]

    def codec_phases(self) -> set[str]:
        """The phases that run the VAE (validation grids and guard checks decode)."""
        return {"evaluation"}

    @contextmanager
    def phase(self, name: str, *, sync: bool = True) -> Iterator[None]:
        """Phase ``name`` of the loop: timed by the ledger (``sync``: at CUDA-synchronised boundaries), with the
        offloaded networks it runs on the device and the others on the host."""
        with self.ledger.phase(name, sync=sync), self.residency.phase(name):
            yield

    # -- hooks -------------------------------------------------------------------------------
    def check_ranks(self) -> None:
        """Refuse a process count the trainer cannot split its work over (before ``setup``)."""

    def setup(self) -> None:
        """Load what the trainer reads (data, conditions, snapshots); called once before the optimizer."""

    def _after_acquisition_cycle(self) -> dict[str, float]:
        """After each data epoch or rollout iteration (e.g. refresh an old-policy snapshot); its metrics."""
        return {}

    # -- what the trainer type defines ---------------------------------------------------------
    @property
    @abstractmethod
    def budget(self) -> int:
        """Budget units of the stage: optimizer steps (dataset) or rollout iterations (generation)."""

    @property
    @abstractmethod
    def completed_units(self) -> int:
        """Budget units done: optimizer steps (dataset) or rollout iterations (generation)."""

    @property
    def position(self) -> dict[str, int | None]:
        """Where the stage stands, as its events record it: optimizer steps, and rollout iterations when the
        budget counts them."""
        iteration = self.completed_units if self.args.budget_unit == "iteration" else None
        return {"step": self.progress.optimizer_step, "iteration": iteration}

    @abstractmethod
    def _run_cycles(self, budget: int) -> None:
        """Acquire and optimise until ``budget`` units are done, ending each unit with ``_end_budget_unit``."""

    # -- the loop ------------------------------------------------------------------------------
    def start(self) -> TrainingProgress:
        """Run the stage to its budget (resuming from the latest checkpoint when allowed)."""
        self.ledger.start()
        self._seed_everything()
        resumed = self._resume() if self.spec.resume else None
        self.callbacks.on_train_start(self)
        budget, ranks, layout = self.budget, self.accelerator.num_processes, self.parallel.name
        moved = resumed is not None and (resumed.world_size, resumed.layout) != (ranks, layout)
        self.events.write(
            StartEvent(
                stage=self.stage,
                **self.position,
                budget=budget,
                resumed_from=str(resumed.path) if resumed else None,
                ranks=ranks,
                layout=layout,
                resumed_with_ranks_from=resumed.world_size if resumed and moved else None,
                resumed_with_layout_from=resumed.layout if resumed and moved else None,
            )
        )
        try:
            self._check_start()
            self._run_cycles(budget)
        except GuardFired as fired:
            self.progress = self.checkpoints.restore(fired.last_good.step)
            log.warning("stage %s: %s", self.stage, fired)
        if self.checkpoints.saved != self.progress:
            self.save_checkpoint()
        if not self.parallel.ranks_agree(self.model):
            raise FlowpostError(
                f"stage {self.stage!r}: the {self.accelerator.num_processes} ranks ended with different weights",
                where=str(self.output_dir),
            )
        with self.phase("checkpoint"):
            self.checkpoints.save_final(self.progress)
        if self.guard is not None and self.accelerator.is_main_process:
            write_json_atomic(self.output_dir / "final" / GUARD_FILE, self.guard.summary())
        self.cost = self.ledger.summary()  # on every rank: peak memory is gathered over them
        if self.accelerator.is_main_process:
            write_json_atomic(self.output_dir / "final" / COST_FILE, self.cost)
        self.callbacks.on_train_end(self)
        self.events.write(
            DoneEvent(
                stage=self.stage,
                **self.position,
                progress=self.progress.to_dict(),
                ranks=self.accelerator.num_processes,
            )
        )
        return self.progress

    def _resume(self) -> Resumed | None:
        resumed = self.checkpoints.resume()
        if resumed is None:
            return None
        self.progress = resumed.progress
        warning = resume_warning(resumed.world_size, resumed.layout, self.accelerator.num_processes, self.parallel.name)
        if warning is not None:
            log.warning("stage %s %s", self.stage, warning)
        return resumed

    def save_checkpoint(self) -> None:
        with self.phase("checkpoint"):
            self.checkpoints.save(self.progress, position=self.position)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate gradients of ``loss`` (already divided by the accumulation count); a loss with no path to a
        trainable weight (a replay pass over steps a frozen Wan2.2 expert denoises) adds none."""
        if loss.requires_grad:
            self.parallel.backward(loss, self.accelerator)

    def backpropagate(self, objective: Objective) -> Metrics:
        """Backpropagate each loss part ``objective`` yields before asking for the next; its metrics."""
        while True:
            try:
                part = next(objective)
            except StopIteration as done:
                return done.value
            self.backward(part)

    def _read_step(self, metrics: Metrics, parameters: list[torch.nn.Parameter]) -> tuple[dict[str, float], bool]:
        """The step's metrics on the host and whether it is bad (on any rank): one device-to-host read,
        which the skip decision needs anyway, brings the finiteness check and every metric back."""
        host, finite = to_host(metrics, step_is_finite(metrics.get("loss"), parameters))
        return host, self.bad_steps.is_bad(finite, self.accelerator.device)

    def step_optimizer(self, metrics: Metrics, *, micro_batches: int = 0) -> dict[str, float]:
        """Clip/inspect (callbacks), step, schedule, zero; advance ``optimizer_step``; run step callbacks
        and, when due, validation. Returns the step's metrics (on the host, averaged over ranks).

        A step whose loss or gradients are non-finite on any rank is skipped on every rank (gradients
        zeroed, no optimizer or scheduler step) and counted in ``skipped_steps``.
        """
        metrics = dict(metrics)
        sync_seconds = self.parallel.sync_gradients(self.trainable)
        if sync_seconds is not None:
            metrics["grad_sync_seconds"] = sync_seconds
        host, bad = self._read_step(metrics, self.trainable)
        if not bad:
            host.update(self.callbacks.on_before_optimizer_step(self))
            host["lr"] = self.scheduler.get_last_lr()[0]
            self.optimizer.step()
            host.update(self.parallel.step_metrics())
            self.scheduler.step()
        if self.bad_steps.total:
            host["skipped_steps"] = float(self.bad_steps.total)
        self.optimizer.zero_grad(set_to_none=True)
        self.progress = self.progress.after_optimizer_step(micro_batches)
        host = {**self.cycle_metrics, **mean_over_ranks(host)}
        self.callbacks.on_step_end(self, host)
        self._validate_if_due()
        return host

    def step_role(self, role: str, metrics: Metrics) -> dict[str, float]:
        """One update of trainable role ``role``: the first role's is ``step_optimizer`` (it advances
        ``optimizer_step``, step callbacks and validation); another role's steps its own optimizer and
        counter only. Returns the update's metrics (on the host, averaged over ranks, prefixed by the role)."""
        if role == self.required_trainable_roles[0]:
            host = self.step_optimizer(metrics)
        else:
            optimizer = self.roles[role]
            self.parallel.sync_gradients(optimizer.parameters)
            host, bad = self._read_step(metrics, optimizer.parameters)
            if not bad:
                host.update(self.callbacks.on_before_optimizer_step(self))
                host["lr"] = optimizer.scheduler.get_last_lr()[0]
                optimizer.step()
                optimizer.scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            optimizer.updates += 1
            host = mean_over_ranks(host)
        return {f"{role}/{key}": value for key, value in host.items() if key not in self.cycle_metrics}

    def _validate_if_due(self) -> None:
        """A validation grid when one is due: with sharded weights every rank generates; rank 0 writes."""
        step, main = self.progress.optimizer_step, self.accelerator.is_main_process
        if self.validation is None or not self.validation.due(step) or not (main or self.parallel.collective_passes):
            return
        with self.phase("evaluation"):
            if main:
                self.callbacks.on_validation_begin(self)
            images = self.validation.generate(self.adapter, seed=self.spec.seed, stage=self.stage)
            if main:
                self.callbacks.on_validation_end(self, self.validation.save(images, step))

    def _check_start(self) -> None:
        """The guard's baseline: the start weights, checked and checkpointed (the first good checkpoint)."""
        if self.guard is None or self.guard.start is not None:  # none, or resumed with its baseline
            return
        self._check_guard()
        self.save_checkpoint()

    def _check_guard(self) -> None:
        """Check the weights with the guard; a violation (on any rank) raises ``GuardFired``."""
        assert self.guard is not None
        done, step = self.completed_units, self.progress.optimizer_step
        with self.phase("evaluation"):
            check = self.guard.check(self.adapter, units=done, step=step)
        check = self.guard.record(check, passed=not any_over_ranks(not check.passed, self.accelerator.device))
        last_good = self.guard.last_good
        assert self.guard.start is not None and last_good is not None  # the baseline passes or raises
        self.events.write(
            GuardEvent(
                stage=self.stage,
                **self.position,
                values=check.values,
                start=self.guard.start,
                violations=check.violations,
                last_good=None if check.passed else last_good.step,
            )
        )
        if not check.passed:
            raise GuardFired(self.stage, self.guard, check, last_good)

    def _end_budget_unit(self, budget: int, metrics: dict[str, float]) -> None:
        """Event, guard and checkpoint cadence, counted in budget units; a guard check that passes is
        checkpointed, one that fails ends the stage (``GuardFired``) before its weights are; a stop request
        or too many bad steps in a row end the stage here, after a checkpoint."""
        done = self.completed_units
        stopping = self.bad_steps.exhausted or any_over_ranks(stop_requested() is not None, self.accelerator.device)
        if done % self.args.log_every == 0 or done == budget or stopping:
            self.events.write(ProgressEvent(stage=self.stage, **self.position, budget=budget, metrics=metrics))
        guarded = self.guard is not None and self.guard.due(done, budget)
        if guarded:
            self._check_guard()
        due = guarded or (self.args.checkpoint_every and done % self.args.checkpoint_every == 0)
        if due or (stopping and self.checkpoints.saved != self.progress):
            self.save_checkpoint()
        if self.bad_steps.exhausted:
            raise FlowpostError(
                f"stage {self.stage!r}: {self.bad_steps.in_a_row} optimizer steps in a row had a non-finite loss or "
                f"gradients (skipped, {self.bad_steps.total} in all); stopped with a checkpoint at optimizer step "
                f"{self.progress.optimizer_step}; lower train.lr or add callbacks.grad_clip, then run again to resume",
                where=f"stages.{self.stage}.train.max_bad_steps",
            )
        if stopping:
            raise StageStopped(self.stage, describe_position(**self.position), stop_requested() or signal.SIGTERM)

    def _seed_everything(self) -> None:
        seed = self.spec.seed
        random.seed(seed)
        np.random.seed(seed % (1 << 32))
        torch.manual_seed(seed)
