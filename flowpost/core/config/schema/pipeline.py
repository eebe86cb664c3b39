"""A whole pipeline file, and the checks that span its sections."""

from __future__ import annotations

from pydantic import Field, model_validator

from flowpost.core.config.base import OmittingModel
from flowpost.core.config.schema.captioned import CaptionedDataset
from flowpost.core.config.schema.datasets import (
    DatasetConfig,
    PromptFilesDataset,
    SampledDataset,
    TrajectoriesDataset,
)
from flowpost.core.config.schema.evaluation import EvaluateConfig, MetricConfig
from flowpost.core.config.schema.export import ExportConfig
from flowpost.core.config.schema.models import ConditionsConfig, LatentsConfig
from flowpost.core.config.schema.names import INIT_KEYWORDS, Key, Name, unknown
from flowpost.core.config.schema.references import (
    Problems,
    cache_problems,
    data_problems,
    init_problems,
    latent_reader_problems,
    latents_problems,
    sampled_dataset_problems,
)
from flowpost.core.config.schema.stages import StageConfig


class PipelineConfig(OmittingModel):
    """A whole pipeline file (``latents`` is left out of the params while no cache is declared, so pipelines
    without one keep their params)."""

    OMITTED_AT_DEFAULT = ("latents",)

    name: str = Name
    seed: int = 0
    smoke: bool = False
    datasets: dict[Key, DatasetConfig] = Field(min_length=1)
    conditions: dict[Key, ConditionsConfig] = Field(default_factory=dict)
    latents: dict[Key, LatentsConfig] = Field(default_factory=dict)
    stages: dict[Key, StageConfig] = Field(min_length=1)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    export: ExportConfig | None = None

    @model_validator(mode="after")
    def _references(self) -> PipelineConfig:
        errors: Problems = []
        for name, latents in self.latents.items():
            errors += latents_problems(name, latents, self.datasets)
        errors += cache_problems(self)
        for name, dataset in self.datasets.items():
            if isinstance(dataset, SampledDataset):
                where = f"datasets.{name}.{dataset.SAMPLED_FIELD}"
                errors += sampled_dataset_problems(self, where, dataset.sampled)
        errors += self._stage_problems()
        errors += self._evaluate_problems()
        errors += self._export_problems()
        if errors:
            raise ValueError("\n  ".join(f"{path}: {msg}" for path, msg in errors))
        return self

    def _stage_problems(self) -> Problems:
        """Stage names, data, latent caches and starting weights, in the stages' order."""
        errors: Problems = []
        earlier: list[str] = []
        gated = bool(self.export and self.export.promote)
        for name, stage in self.stages.items():
            if name in INIT_KEYWORDS:
                errors.append((f"stages.{name}", f"{name!r} is reserved for model.init; rename the stage"))
            if stage.data is not None:
                errors += data_problems(self, name)
                errors += latent_reader_problems(self, name)
                dataset = stage.data.dataset
                read = self.datasets.get(dataset)
                sampled = read.trajectories if isinstance(read, TrajectoriesDataset) else None
                if sampled is not None and sampled.stage not in earlier:
                    message = f"{dataset!r} is sampled from stage {sampled.stage!r}, which must be an earlier stage"
                    errors.append((f"stages.{name}.data.dataset", message))
            errors += init_problems(name, stage.model, earlier, gated=gated)
            earlier.append(name)
        return errors

    def _evaluate_problems(self) -> Problems:
        """The evaluated stages, dataset and cache (the first dataset and cache by default)."""
        errors: Problems = []
        for i, stage_name in enumerate(self.evaluate.after):
            if stage_name not in self.stages:
                errors.append((f"evaluate.after.{i}", unknown("stage", stage_name, self.stages)))
        if self.evaluate.dataset is None:
            self.evaluate.dataset = next(iter(self.datasets))
        if self.evaluate.conditions is None and self.conditions:
            self.evaluate.conditions = next(iter(self.conditions))
        if self.evaluate.dataset not in self.datasets:
            errors.append(("evaluate.dataset", unknown("dataset", self.evaluate.dataset, self.datasets)))
        else:
            errors += self._held_out_problems(self.datasets[self.evaluate.dataset])
        if self.evaluate.after and self.evaluate.conditions not in self.conditions:
            errors.append(
                ("evaluate.conditions", unknown("conditions", str(self.evaluate.conditions), self.conditions))
            )
        return errors

    def _held_out_problems(self, dataset: DatasetConfig) -> Problems:
        """Fills the metrics in that the dataset's source defaults to; without those, it needs metrics, and
        held-out prompts."""
        if self.evaluate.metrics is None and dataset.DEFAULT_METRICS:
            self.evaluate.metrics = [MetricConfig.model_validate(m) for m in dataset.DEFAULT_METRICS]
        if not self.evaluate.after:
            return []
        name = self.evaluate.dataset
        if self.evaluate.metrics is None:
            return [("evaluate.metrics", f"name the metrics for dataset {name!r}, e.g. [brightness, clip_score]")]
        if isinstance(dataset, CaptionedDataset) and dataset.split.eval == 0:
            return [("evaluate.dataset", f"dataset {name!r} holds nothing out; set datasets.{name}.split.eval")]
        cache = self.evaluate.conditions
        test = "test_prompts" if "test_prompts" not in self.datasets else f"{name}_test"
        advice = (
            f"put the test prompts in a file of their own (as Flow-GRPO's test.txt), add it as datasets.{test}: "
            f"{{source: prompt-files, path: prompts/test.txt}}, list {test} in conditions.{cache}.datasets and set "
            f"evaluate.dataset: {test}"
        )
        if isinstance(dataset, SampledDataset):
            return [("evaluate.dataset", f"dataset {name!r} is sampled from a stage, not held out; {advice}")]
        errors = []
        if isinstance(dataset, PromptFilesDataset):
            if users := self._prompt_users(str(name)):
                message = (
                    f"dataset {name!r} holds training prompts ({users[0]} reads them), so none is held out; {advice}"
                )
                errors.append(("evaluate.dataset", message))
        if cache in self.conditions and name not in self.conditions[cache].datasets:
            errors.append(
                ("evaluate.conditions", f"cache {cache!r} does not encode dataset {name!r}; add it to its datasets")
            )
        return errors

    def _prompt_users(self, name: str) -> list[str]:
        """Where prompt dataset ``name`` is trained on: a stage's data, or a dataset sampled on its prompts."""
        users = [
            f"stages.{stage}.data.{key}"
            for stage, config in self.stages.items()
            for key in ("dataset", "prompts")
            if config.data is not None and getattr(config.data, key) == name
        ]
        for other, dataset in self.datasets.items():
            if isinstance(dataset, SampledDataset) and dataset.sampled.prompts == name:
                users.append(f"datasets.{other}.{dataset.SAMPLED_FIELD}.prompts")
        return users

    def _export_problems(self) -> Problems:
        """The exported stage exists, loads a pipeline for the pipeline format, and is evaluated on the metrics
        its gate compares."""
        export = self.export
        if export is None:
            return []
        if export.from_stage not in self.stages:
            return [("export.from", unknown("stage", export.from_stage, self.stages))]
        errors: Problems = []
        if "pipeline" in export.formats and self.stages[export.from_stage].model.pretrained is None:
            errors.append(("export.formats", "'pipeline' needs a stage loaded from model.pretrained"))
        if export.promote is None:
            return errors
        if export.from_stage not in self.evaluate.after:
            message = (
                f"compares evaluation metrics, but stage {export.from_stage!r} is not evaluated; "
                "add it to evaluate.after"
            )
            return [*errors, ("export.promote", message)]
        produced = [metric.result_key for metric in self.evaluate.metrics or []]
        if self.evaluate.metrics is not None and (
            missing := [key for key in export.promote.metrics if key not in produced]
        ):
            message = (
                f"unknown metric {', '.join(map(repr, missing))}; the evaluation (evaluate.metrics) produces: "
                f"{', '.join(produced)}"
            )
            errors.append(("export.promote.metrics", message))
        return errors
