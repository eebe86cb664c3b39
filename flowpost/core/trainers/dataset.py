"""DatasetTrainer: the dataset contract. One complete finite loader per data epoch.

``data_epoch`` advances only after a clean exhaustion; gradients accumulate explicitly over
``gradient_accumulation_steps`` micro-batches, and a trailing partial window is never used.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any, ClassVar

import torch

from flowpost.core.contracts import Acquisition
from flowpost.core.trainers.arguments import DatasetArguments
from flowpost.core.trainers.base import BaseTrainer
from flowpost.core.trainers.inputs import BatchLoader
from flowpost.core.trainers.objective import Metrics, accumulate
from flowpost.errors import FlowpostError


class DatasetTrainer(BaseTrainer):
    """Implements ``build_loader`` and ``optimize_batch``; the budget is optimizer steps."""

    acquisition: ClassVar[Acquisition] = Acquisition.DATASET
    arguments_base: ClassVar[type[DatasetArguments]] = DatasetArguments
    args: DatasetArguments
    _micro_index = 0
    _codec_checked = False

    @abstractmethod
    def build_loader(self) -> BatchLoader:
        """The finite, rank-aware loader (``batches_per_epoch``, ``iter_epoch``)."""

    def rank_loader(self, factory: Callable[..., BatchLoader]) -> BatchLoader:
        """This rank's loader from a stage input's ``factory``: the global batch size, the stage's seed."""
        return factory(
            global_batch_size=self.args.batch_size,
            seed=self.spec.seed,
            rank=self.accelerator.process_index,
            world_size=self.accelerator.num_processes,
        )

    @abstractmethod
    def optimize_batch(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """``{"loss": scalar, ...metrics}`` of one micro-batch, as tensors: the loop backpropagates the loss
        and keeps the metrics on the device (``core/trainers/objective.py``)."""

    @property
    def budget(self) -> int:
        return self.args.budget

    @property
    def completed_units(self) -> int:
        return self.progress.optimizer_step

    def noise_address(self, local_batch_size: int) -> dict[str, Any]:
        """The address of this rank's micro-batch rows' noise (``addressed_randn(..., **address)``): the stage's
        seed and name, the optimizer step, and the rows' global indices within that step."""
        base = self._micro_index * self.args.batch_size + self.accelerator.process_index * local_batch_size
        return {
            "seed": self.spec.seed,
            "stage": self.stage,
            "step": self.progress.optimizer_step,
            "indices": list(range(base, base + local_batch_size)),
        }

    def clean_latents(self, batch: dict[str, Any], arm: str) -> torch.Tensor:
        """The clean latents of the batch's ``arm`` (``image``, ``chosen``, ``rejected``) on the device: the
        latent cache's (``<arm>_latents``) when the stage reads one, else the media encoded now."""
        cached = batch.get(f"{arm}_latents")
        if cached is None:
            return self.adapter.encode_output_state(batch[arm].to(self.accelerator.device))
        if not self._codec_checked:
            self._check_latent_codec()
        return cached.to(self.accelerator.device)

    def _check_latent_codec(self) -> None:
        """Refuse a latent cache that another codec (family, VAE weights or options) filled."""
        if self.inputs.latent_codec != self.adapter.codec_fingerprint():
            raise FlowpostError(
                f"the latent cache {self.spec.latents_dir} was encoded by another codec than this stage's "
                f"{self.adapter.family!r} model (another family, VAE or options); set the cache's model to the "
                "stage's family, pipeline and options and re-run the latents node",
                where=f"stages.{self.stage}.data.latents",
            )
        self._codec_checked = True

    def _run_cycles(self, budget: int) -> None:
        loader = self.build_loader()
        accum = self.args.gradient_accumulation_steps
        usable = loader.batches_per_epoch - loader.batches_per_epoch % accum
        if usable == 0:
            raise FlowpostError(
                f"the dataset gives {loader.batches_per_epoch} batches per epoch at this batch size, "
                f"fewer than gradient_accumulation_steps={accum}; lower batch_size or accumulation",
                where=f"stages.{self.stage}.train.batch_size",
            )
        while self.progress.optimizer_step < budget:
            self._run_epoch(loader, usable, accum, budget)

    def _run_epoch(self, loader: BatchLoader, usable: int, accum: int, budget: int) -> None:
        """One pass; ``data_epoch`` advances only when all ``usable`` batches ran cleanly."""
        sums: Metrics = {}
        start = self.progress.epoch_cursor
        batches = islice(loader.iter_epoch(self.progress.data_epoch, start_batch=start), usable - start)
        for offset, batch in enumerate(self._timed(batches)):
            with self.phase("optimize", sync=False):  # host time; the step's one read syncs the device
                self._micro_index = offset % accum
                outputs = self.optimize_batch(batch)
                self.backward(outputs["loss"] / accum)
                accumulate(sums, outputs, divisor=accum)
                if self._micro_index == accum - 1:
                    metrics = self.step_optimizer(sums, micro_batches=accum)
                    if start + offset + 1 >= usable:
                        self.progress = self.progress.after_epoch()
                        metrics |= self._after_acquisition_cycle()
                    sums = {}
                    self.ledger.count(self.args.batch_size * accum)
            if self._micro_index == accum - 1:
                self._end_budget_unit(budget, metrics)
                if self.progress.optimizer_step >= budget:
                    return

    def _timed(self, batches: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """``batches``, the wait for each timed as the ledger's ``data`` phase (host time, no device sync)."""
        while True:
            with self.phase("data", sync=False):
                batch = next(batches, None)
            if batch is None:
                return
            yield batch
