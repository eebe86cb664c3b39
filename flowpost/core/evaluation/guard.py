"""A stage's guard: held-out samples of the weights being trained, scored at intervals and compared with
the stage start. A judge that falls by more than its allowed drop, or an image statistic that leaves its
band, is a violation: the loop then ends the stage with the last checkpoint that passed."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from flowpost.core.conditions import ConditionBatch
from flowpost.core.evaluation.plan import EvalPlan, generate
from flowpost.core.evaluation.samples import EvalSamples, Metric
from flowpost.core.models.base import ModelAdapter
from flowpost.core.progress import BudgetUnit, describe_position
from flowpost.core.snapshots import Snapshot
from flowpost.errors import FlowpostError

GUARD_FILE = "guard.json"  # beside a stage's final weights: the guard's record


@dataclass(frozen=True)
class Band:
    """Where a statistic may be: at least ``min``, at most ``max``, within ``max_change`` of its start."""

    min: float | None = None
    max: float | None = None
    max_change: float | None = None

    def violation(self, value: float, start: float) -> str | None:
        """Why ``value`` is outside the band (``start``: the value at the stage start), or None."""
        if self.min is not None and value < self.min:
            return f"{value:.4g} is below its min {self.min:g}"
        if self.max is not None and value > self.max:
            return f"{value:.4g} is above its max {self.max:g}"
        change = abs(value - start)
        if self.max_change is not None and change > self.max_change:
            return f"{value:.4g} is {change:.4g} from its start {start:.4g} (max_change {self.max_change:g})"
        return None


@dataclass(frozen=True)
class Judge:
    """The guarded metric ``key``: ``better`` is its good direction; a fall beyond ``max_drop`` is a violation."""

    key: str
    metric: Metric
    max_drop: float
    better: Literal["higher", "lower"] = "higher"

    def violation(self, value: float, start: float) -> str | None:
        drop = start - value if self.better == "higher" else value - start
        if drop > self.max_drop:
            return f"{value:.4g} is {drop:.4g} worse than its start {start:.4g} (max_drop {self.max_drop:g})"
        return None


@dataclass(frozen=True)
class HeldOut:
    """The held-out prompts a guard samples: their conditions (rows align with ``prompts``), the null
    prompt's, each prompt's metadata, and the held-out real images (None when the dataset has none)."""

    prompts: list[str]
    metadata: list[dict[str, Any]]
    conditions: ConditionBatch
    negative: ConditionBatch
    reference: Tensor | None = None


@dataclass(frozen=True)
class GuardCheck:
    """One check after ``units`` budget units (optimizer step ``step``): the values, what they violate."""

    units: int
    step: int
    values: dict[str, float]
    violations: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.violations


class StageGuard:
    """Checks the weights every ``every`` budget units (``unit``: steps, or iterations of an online trainer)
    and at the end of the budget; the first check, at
    the stage start, is the baseline the others are compared with.

    ``weights`` is the snapshot checked (``ema`` falls back to the live weights without one). ``where``
    is the guard's config path, for errors.
    """

    def __init__(
        self,
        *,
        judge: Judge | None,
        bounds: dict[str, tuple[Metric, Band]],
        every: int,
        unit: BudgetUnit = "step",
        plan: EvalPlan,
        held_out: HeldOut,
        weights: Literal["ema", "live"] = "ema",
        where: str = "guard",
    ) -> None:
        if judge is None and not bounds:
            raise FlowpostError("a guard needs a metric with max_drop, or bounds", where=where)
        if every < 1:
            raise FlowpostError(
                "a guard checks every guard.every steps (iterations of an online trainer), or at "
                "train.checkpoint_every; set one of them",
                where=f"{where}.every",
            )
        self.judge = judge
        self.bounds = bounds
        self.every = every
        self.unit = unit
        self.plan = plan
        self.held_out = held_out
        self.weights = weights
        self.where = where
        self.start: dict[str, float] | None = None
        self.checks: list[GuardCheck] = []

    def position(self, check: GuardCheck) -> str:
        """Where ``check`` was made: ``step 10``, or ``iteration 5 (step 10)``."""
        return describe_position(check.step, check.units if self.unit == "iteration" else None)

    def due(self, units: int, budget: int) -> bool:
        return units % self.every == 0 or units == budget

    @property
    def last_good(self) -> GuardCheck | None:
        """The latest check that passed (the baseline is one)."""
        return next((check for check in reversed(self.checks) if check.passed), None)

    @property
    def fired(self) -> GuardCheck | None:
        """The check that stopped the stage, if one did."""
        return next((check for check in self.checks if not check.passed), None)

    @torch.no_grad()
    def measure(self, adapter: ModelAdapter) -> dict[str, float]:
        """Each guarded metric on the held-out samples of the checked weights."""
        held_out, rows = self.held_out, self.plan.rows()
        snapshot = self.weights == "ema" and Snapshot.EMA in adapter.snapshots
        with adapter.use_snapshot(Snapshot.EMA) if snapshot else contextlib.nullcontext():
            images = generate(adapter, self.plan, held_out.conditions, held_out.negative)
        samples = EvalSamples(
            images=images,
            prompts=[held_out.prompts[r] for r in rows],
            metadata=[held_out.metadata[r] for r in rows],
            reference=held_out.reference,
        )
        metrics = {key: metric for key, (metric, _) in self.bounds.items()}
        if self.judge is not None:
            metrics = {self.judge.key: self.judge.metric, **metrics}
        return {key: float(metric(samples)) for key, metric in metrics.items()}

    def check(self, adapter: ModelAdapter, *, units: int, step: int) -> GuardCheck:
        """Measure the weights after ``units`` budget units; the first check is the baseline and must lie
        inside the absolute bands. The check is not recorded until ``record``."""
        values = self.measure(adapter)
        if self.start is None:
            outside = {key: band.violation(values[key], values[key]) for key, (_, band) in self.bounds.items()}
            if bad := {key: why for key, why in outside.items() if why}:
                key, why = next(iter(bad.items()))
                raise FlowpostError(
                    f"the stage starts outside the band of {key}: {why}; widen the band or remove it",
                    where=f"{self.where}.bounds.{key}",
                )
            self.start = values
            return GuardCheck(units, step, values)
        return GuardCheck(units, step, values, self.violations(values))

    def violations(self, values: dict[str, float]) -> list[str]:
        """What ``values`` violate, one line per metric, compared with the start."""
        assert self.start is not None
        found = []
        if self.judge is not None:
            key = self.judge.key
            if why := self.judge.violation(values[key], self.start[key]):
                found.append(f"{key} {why}")
        for key, (_, band) in self.bounds.items():
            if why := band.violation(values[key], self.start[key]):
                found.append(f"{key} {why}")
        return found

    def record(self, check: GuardCheck, *, passed: bool) -> GuardCheck:
        """Keep ``check`` (``passed`` as every rank agreed); return it as kept."""
        if not passed and check.passed:  # another rank saw a violation
            check = GuardCheck(check.units, check.step, check.values, ["a violation on another rank"])
        self.checks.append(check)
        return check

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the start and the checks so far."""
        return {"start": self.start, "checks": [asdict(check) for check in self.checks]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = state.get("start")
        self.checks = [GuardCheck(**check) for check in state.get("checks", [])]

    def summary(self) -> dict[str, Any]:
        """The guard's record: its settings, the start, every check; when it fired, the check that did and
        the last one that passed (whose checkpoint the stage ended with)."""
        fired, good = self.fired, self.last_good
        return {
            "metric": self.judge.key if self.judge else None,
            "max_drop": self.judge.max_drop if self.judge else None,
            "better": self.judge.better if self.judge else None,
            "bounds": {key: asdict(band) for key, (_, band) in self.bounds.items()},
            "every": self.every,
            "unit": self.unit,
            "samples": self.plan.samples,
            "weights": self.weights,
            "start": self.start,
            "checks": [asdict(check) for check in self.checks],
            "fired": asdict(fired) if fired else None,
            "last_good": asdict(good) if fired and good else None,
        }
