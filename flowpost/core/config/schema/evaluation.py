"""Evaluation of stages: metrics, a stage's guard, the ``evaluate:`` section."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from flowpost.core.config.base import FiniteOptions, OmittingModel, StrictModel
from flowpost.core.config.schema.names import Key
from flowpost.core.evaluation.samples import Better

# what an evaluation's metrics.json holds besides the metrics
RESULT_FIELDS = """trained_reward reward_judge_gap intervals per_seed metrics headline n_samples samples_per_seed
weights seed eval_seed eval_seeds smoke steps guidance stage step grid curve per_category base vs_base""".split()


class MetricConfig(OmittingModel):
    """One evaluation metric: a registered metric or reward name, its options, its key in ``metrics.json``
    (left out of the params while it is the name)."""

    OMITTED_AT_DEFAULT = ("key",)

    name: str
    key: Key | None = Field(None, description="its name in metrics.json and the report; default: name")
    options: FiniteOptions = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @property
    def result_key(self) -> str:
        return self.key or self.name


class StatisticBand(StrictModel):
    """The band a guarded statistic must stay in: absolute ``min`` / ``max``, and at most ``max_change`` away
    from its value at the stage start."""

    min: float | None = Field(None, description="the lowest allowed value")
    max: float | None = Field(None, description="the highest allowed value")
    max_change: float | None = Field(None, ge=0, description="the largest allowed distance from the start's value")
    options: FiniteOptions = Field(default_factory=dict, description="the statistic's options, e.g. {threshold: 0.1}")

    @model_validator(mode="after")
    def _a_band(self) -> StatisticBand:
        if self.min is None and self.max is None and self.max_change is None:
            raise ValueError("give min, max or max_change (or remove the statistic)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}; swap them")
        return self


class GuardConfig(OmittingModel):
    """A stage's guard: every ``every`` budget units it samples the stage's held-out prompts from the current
    weights and scores them; when ``metric`` falls more than ``max_drop`` below its value at the stage start,
    or a statistic of ``bounds`` leaves its band, the stage ends with the last checkpoint that passed.
    ``better`` left out takes the metric's own direction (filled in when the pipeline loads); without a
    ``metric`` it is unread and left out of the params."""

    metric: MetricConfig | None = Field(None, description="the judge: a registered metric, not the stage's reward")
    max_drop: float | None = Field(None, ge=0, description="the largest allowed fall of metric below its start")
    better: Better | None = Field(
        None, description="which direction of metric is better; default: the metric's own (a reward's: higher)"
    )
    bounds: dict[str, StatisticBand] = Field(
        default_factory=dict, description="registered metric (e.g. brightness) -> the band it must stay in"
    )
    every: int | None = Field(None, ge=1, description="budget units between checks; default: train.checkpoint_every")
    samples: int = Field(100, ge=2, description="held-out samples per check (the same noise at every check)")
    steps: int = Field(20, ge=1, description="ODE steps per sample")
    guidance: float = Field(1.0, ge=0)
    seed: int = Field(4321, description="the noise seed of the samples")
    batch_size: int = Field(250, ge=1)
    weights: Literal["ema", "live"] = Field("ema", description="the weights checked; ema falls back to live")

    def inapplicable(self) -> tuple[str, ...]:
        return () if self.metric is not None else ("better",)

    @model_validator(mode="after")
    def _something_guarded(self) -> GuardConfig:
        if (self.metric is None) != (self.max_drop is None):
            raise ValueError("metric and max_drop go together; give both, or neither and only bounds")
        if self.metric is None and not self.bounds:
            raise ValueError("a guard needs a metric with max_drop, or bounds")
        return self


class EvaluateConfig(OmittingModel):
    """Evaluation of stage checkpoints on a dataset's held-out prompts: the held-out split of the digits or of
    an image dataset (``split.eval``), or every prompt of a prompt-files dataset no stage trains on. ``every``
    is left out of the params while unset, and ``compare_to_base`` while off, so pipelines without them keep
    their fingerprints."""

    OMITTED_AT_DEFAULT = ("every", "compare_to_base")

    after: list[str] = Field(default_factory=list)
    dataset: str | None = Field(
        None,
        description="held-out prompts (and real images): a dataset with a held-out split, or a prompt-files "
        "dataset of test prompts kept apart from the training ones; default: first dataset",
    )
    conditions: str | None = Field(None, description="condition cache of the prompts; default: first one")
    metrics: list[MetricConfig] | None = Field(
        None,
        description="registered metrics or rewards; the first is the headline (judge). Default: the metrics the "
        "dataset's source names, if it names any",
    )
    samples: int = Field(500, ge=2, description="per seed; at least 2: a Frechet distance needs a covariance")
    steps: int = Field(20, ge=1)
    guidance: float = Field(1.0, ge=0)
    seed: int = 1234
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        description="noise seeds; several give each metric's mean and 95 % interval; default: [seed]",
    )
    batch_size: int = Field(250, ge=1)
    weights: Literal["ema", "live"] = Field("ema", description="ema falls back to live without EMA")
    every: int | None = Field(
        None,
        ge=1,
        description="budget units between scored checkpoints (a multiple of each evaluated stage's "
        "train.checkpoint_every): eval.<stage>/curve.json, one row per checkpoint and the final weights; "
        "null: the final weights only",
    )
    compare_to_base: bool = Field(
        False,
        description="also sample each evaluated stage's base model (what the first stage of its model.init chain "
        "starts from: the family's pretrained pipeline or its seeded fresh model) with the same prompts and noise: "
        "per metric the base's value, the paired difference and its 95 % interval",
    )

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("a seed is listed twice; list each seed once")
        return value

    @field_validator("metrics")
    @classmethod
    def _distinct_keys(cls, value: list[MetricConfig] | None) -> list[MetricConfig] | None:
        keys = [metric.result_key for metric in value or []]
        if twice := sorted({key for key in keys if keys.count(key) > 1}):
            raise ValueError(f"{', '.join(twice)} is listed twice; give one of them another key")
        if taken := [key for key in keys if key in RESULT_FIELDS]:
            raise ValueError(f"{', '.join(taken)} is a field of metrics.json already; give the metric another key")
        return value

    def noise_seeds(self) -> list[int]:
        """The seeds the samples are drawn with: ``seeds``, or ``seed`` alone."""
        return list(self.seeds) if self.seeds is not None else [self.seed]
