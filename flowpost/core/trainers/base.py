"""BaseTrainer: the one training loop. Algorithms implement hooks; they never override ``start``."""

from __future__ import annotations

import random
from abc import ABC
from collections import defaultdict
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from flowpost.core.callbacks.base import Callback, CallbackList
from flowpost.core.contracts import Acquisition, ExecutionContract, Feedback, Paradigm, check_contracts
from flowpost.core.distributed import mean_over_ranks
from flowpost.core.events import EventLog
from flowpost.core.models.base import ModelAdapter
from flowpost.core.parallel import parallel_layout
from flowpost.core.progress import TrainingProgress
from flowpost.core.rewards.combine import WeightedRewards
from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.trainers.arguments import TrainerArguments
from flowpost.core.trainers.generation import GenerationMixin
from flowpost.core.trainers.inputs import BatchLoader, StageInputs
from flowpost.core.trainers.persistence import PersistenceMixin
from flowpost.core.trainers.spec import StageSpec
from flowpost.errors import FlowpostError

_HOOKS = ("sample", "optimize", "optimize_batch")


class BaseTrainer(GenerationMixin, PersistenceMixin, ABC):
    """Owns seeding, resume, the acquisition loop, the optimizer, cadences and callbacks.

    A concrete trainer declares ``execution_contract`` and ``paradigm`` (equal to its arguments
    class') and implements exactly the hooks its contract requires: ``optimize_batch`` for the
    dataset contract, ``sample`` and ``optimize`` for generation contracts.
    """

    execution_contract: ClassVar[ExecutionContract]
    paradigm: ClassVar[Paradigm]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        contract = cls.__dict__.get("execution_contract")
        if contract is None:
            return
        required = contract.required_hooks()
        missing = [h for h in required if getattr(cls, h) is getattr(BaseTrainer, h)]
        extra = [h for h in _HOOKS if h not in required and getattr(cls, h) is not getattr(BaseTrainer, h)]
        if missing or extra:
            raise TypeError(
                f"{cls.__name__} declares the {contract} contract: it must implement {list(required)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; {extra} belong to another contract" if extra else "")
            )

    def __init__(
        self,
        *,
        spec: StageSpec,
        args: TrainerArguments,
        adapter: ModelAdapter,
        inputs: StageInputs | None = None,
        callbacks: list[Callback] | None = None,
        sampling: SamplingConfig | None = None,
        rewards: WeightedRewards | None = None,
        accelerator: Any | None = None,
    ) -> None:
        check_contracts(type(self), type(args), where=f"stages.{spec.stage}.trainer")
        from accelerate import Accelerator

        self.spec = spec
        self.stage = spec.stage
        self.args = args
        self.adapter = adapter
        self.inputs = inputs or StageInputs()
        self.sampling = sampling or SamplingConfig()
        self.rewards = rewards
        if self.execution_contract.feedback is Feedback.RUNTIME_REWARD and rewards is None:
            raise FlowpostError(
                f"trainer {type(self).__name__} needs at least one reward",
                where=f"stages.{spec.stage}.rewards",
            )
        self.output_dir = Path(spec.output_dir)
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.callbacks = CallbackList(callbacks or [])
        self.progress = TrainingProgress()
        self.events = EventLog(
            self.output_dir / "events.jsonl",
            stage=self.stage,
            enabled=self.accelerator.is_main_process,
        )
        self._micro_index = 0
        backend = spec.launch.get("backend", "ddp")
        self.parallel = parallel_layout(backend, self.accelerator.num_processes)
        model = self.parallel.prepare(adapter, self.accelerator.device)
        self.setup()
        model.train()
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(self.trainable, lr=args.lr, betas=args.adam_betas, weight_decay=args.weight_decay)
        warmup = args.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.model = model  # never wrapped: the layout synchronises gradients (flowpost.core.parallel)
        self.optimizer = self.parallel.prepare_optimizer(model, optimizer, self.accelerator)

    # -- hooks -------------------------------------------------------------------------------
    def setup(self) -> None:
        """Load what the trainer reads (data, conditions); called once before the optimizer."""

    def sample(self) -> list[Any]:
        """Generation contracts: produce one acquisition cycle of samples."""
        raise TypeError(f"{type(self).__name__} does not acquire by generation")

    def optimize(self, samples: list[Any]) -> None:
        """Generation contracts: update the policy from one cycle's samples."""
        raise TypeError(f"{type(self).__name__} does not acquire by generation")

    def optimize_batch(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Dataset contract: return ``{"loss": scalar, ...metrics}`` for one micro-batch."""
        raise TypeError(f"{type(self).__name__} does not train on a dataset")

    def build_loader(self) -> BatchLoader:
        """Dataset contract: the finite, rank-aware loader (``batches_per_epoch``, ``iter_epoch``)."""
        raise TypeError(f"{type(self).__name__} does not train on a dataset")

    def _after_acquisition_cycle(self) -> None:
        """Called after each data epoch or rollout iteration (e.g. to refresh an old-policy snapshot)."""

    # -- the loop ------------------------------------------------------------------------------
    @property
    def completed_units(self) -> int:
        """Budget units done: optimizer steps (dataset) or rollout iterations (generation)."""
        if self.execution_contract.acquisition is Acquisition.DATASET:
            return self.progress.optimizer_step
        return self.progress.rollout_iteration

    def start(self) -> TrainingProgress:
        """Run the stage to its budget (resuming from the latest checkpoint when allowed)."""
        self._seed_everything()
        resumed = self._resume() if self.spec.resume else None
        self.callbacks.on_train_start(self)
        budget = self.args.budget  # type: ignore[attr-defined]
        self.events.emit(
            "start",
            step=self.completed_units,
            max_steps=budget,
            resumed_from=resumed,
            ranks=self.accelerator.num_processes,
            **(self._resumed_with or {}),
        )
        if self.execution_contract.acquisition is Acquisition.DATASET:
            self._run_dataset_epochs(budget)
        else:
            self._run_generation_iterations(budget)
        if self._saved_progress != self.progress:
            self.save_checkpoint()
        self.callbacks.on_train_end(self)
        if not self.parallel.ranks_agree(self.model):
            raise FlowpostError(
                f"stage {self.stage!r}: the {self.accelerator.num_processes} ranks ended with different weights",
                where=str(self.output_dir),
            )
        self.save_final_weights()
        self.events.emit(
            "done", step=self.completed_units, progress=self.progress.to_dict(), ranks=self.accelerator.num_processes
        )
        return self.progress

    def _run_generation_iterations(self, budget: int) -> None:
        """sample -> (rewards and advantages, by the base) -> optimize, once per iteration."""
        while self.progress.rollout_iteration < budget:
            samples = self.sample()
            self._feedback_metrics = {}
            if self.execution_contract.feedback is Feedback.RUNTIME_REWARD:
                self._feedback_metrics = mean_over_ranks(self.score(samples))
            self._unit_metrics = dict(self._feedback_metrics)
            self.optimize(samples)
            self.progress = self.progress.after_rollout()
            self._after_acquisition_cycle()
            self._end_budget_unit(budget, self._unit_metrics)

    def _run_dataset_epochs(self, budget: int) -> None:
        loader = self.build_loader()
        accum = self.args.gradient_accumulation_steps  # type: ignore[attr-defined]
        usable = loader.batches_per_epoch - loader.batches_per_epoch % accum
        if usable == 0:
            raise FlowpostError(
                f"the dataset gives {loader.batches_per_epoch} batches per epoch at this batch size, "
                f"fewer than gradient_accumulation_steps={accum}; lower batch_size or accumulation",
                where=f"stages.{self.stage}.train.batch_size",
            )
        while self.progress.optimizer_step < budget:
            self._run_dataset_epoch(loader, usable, accum, budget)

    def _run_dataset_epoch(self, loader: BatchLoader, usable: int, accum: int, budget: int) -> None:
        """One pass; ``data_epoch`` advances only when all ``usable`` batches ran cleanly."""
        sums: dict[str, float] = defaultdict(float)
        start = self.progress.epoch_cursor
        batches = islice(loader.iter_epoch(self.progress.data_epoch, start_batch=start), usable - start)
        for offset, batch in enumerate(batches):
            self._micro_index = offset % accum
            outputs = self.optimize_batch(batch)
            self.backward(outputs["loss"] / accum)
            for key, value in outputs.items():
                sums[key] += float(value.detach()) / accum
            if self._micro_index == accum - 1:
                metrics = self.step_optimizer(dict(sums), micro_batches=accum)
                if start + offset + 1 >= usable:
                    self._finish_epoch()
                sums.clear()
                self._end_budget_unit(budget, metrics)
                if self.progress.optimizer_step >= budget:
                    return

    def _finish_epoch(self) -> None:
        self.progress = self.progress.after_epoch()
        self._after_acquisition_cycle()

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate gradients of ``loss`` (already divided by the accumulation count)."""
        self.parallel.backward(loss, self.accelerator)

    def step_optimizer(self, metrics: dict[str, float], *, micro_batches: int = 0) -> dict[str, float]:
        """Clip/inspect (callbacks), step, schedule, zero; advance ``optimizer_step``; run step callbacks."""
        metrics = dict(metrics)
        sync_seconds = self.parallel.sync_gradients(self.trainable)
        if sync_seconds is not None:
            metrics["grad_sync_seconds"] = sync_seconds
        metrics.update(self.callbacks.on_before_optimizer_step(self))
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        metrics.update(self.parallel.step_metrics())
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress = self.progress.after_optimizer_step(micro_batches)
        metrics = {**self._feedback_metrics, **mean_over_ranks(metrics)}  # trackers see this cycle's rewards
        self.callbacks.on_step_end(self, metrics)
        return metrics

    def _end_budget_unit(self, budget: int, metrics: dict[str, float]) -> None:
        """Event and checkpoint cadence, counted in budget units."""
        done = self.completed_units
        if done % self.args.log_every == 0 or done == budget:
            self.events.emit("step", step=done, max_steps=budget, metrics=metrics)
        if self.args.checkpoint_every and done % self.args.checkpoint_every == 0:
            self.save_checkpoint()

    # -- addressing ------------------------------------------------------------------------------
    def sample_indices(self, local_batch_size: int) -> list[int]:
        """Global indices, within the current optimizer step, of this rank's micro-batch rows."""
        global_batch = self.args.batch_size  # type: ignore[attr-defined]
        base = self._micro_index * global_batch + self.accelerator.process_index * local_batch_size
        return list(range(base, base + local_batch_size))

    # -- state ---------------------------------------------------------------------------------
    _unit_metrics: dict[str, float] = {}
    _feedback_metrics: dict[str, float] = {}

    def _seed_everything(self) -> None:
        seed = self.spec.seed
        random.seed(seed)
        np.random.seed(seed % (1 << 32))
        torch.manual_seed(seed)
