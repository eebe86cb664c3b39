"""Before anything runs: the prompt files a reward or metric reads metadata from hold that metadata in every row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from flowpost.core.config.schema.datasets import PromptFilesDataset
from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.core.evaluation.registry import metric_metadata_fields
from flowpost.core.rewards.metadata_fields import check_metadata_fields
from flowpost.data.prompt_files import read_prompt_files
from flowpost.errors import FlowpostError


def prompt_metadata_problems(pipeline: PipelineConfig) -> list[str]:
    """``where: message`` for each reward or metric whose prompt-files dataset has a row without a metadata
    field it reads (``metadata_fields``), or a malformed row; a path that does not exist yet is left to the
    dataset's acquisition."""
    problems = []
    for name, dataset_name, where in _scorers(pipeline):
        dataset = pipeline.datasets.get(dataset_name)
        if not isinstance(dataset, PromptFilesDataset) or not Path(dataset.path).exists():
            continue
        if not (fields := metric_metadata_fields(name, where=where)):
            continue
        try:
            records = read_prompt_files(dataset.path, where=f"datasets.{dataset_name}.path").records
            rows = ((record.prompt, record.metadata) for record in records)
            check_metadata_fields(name, fields, rows, dataset=dataset_name, where=where)
        except FlowpostError as exc:  # a missing field, or a malformed row named by its file and line
            if str(exc) not in problems:
                problems.append(str(exc))
    return problems


def _scorers(pipeline: PipelineConfig) -> Iterator[tuple[str, str, str]]:
    """``(name, dataset, where)``: each stage reward with the dataset it rolls out, each evaluation metric and
    each evaluated stage's reward with the evaluation's dataset."""
    for stage_name, stage in pipeline.stages.items():
        if stage.data is not None:
            dataset = stage.data.prompts or stage.data.dataset
            for i, reward in enumerate(stage.rewards):
                yield reward.name, dataset, f"stages.{stage_name}.rewards.{i}"
    evaluate = pipeline.evaluate
    if evaluate.dataset is None:
        return
    for i, metric in enumerate(evaluate.metrics or []):
        yield metric.name, evaluate.dataset, f"evaluate.metrics.{i}"
    for stage_name in evaluate.after:
        for i, reward in enumerate(pipeline.stages[stage_name].rewards):
            yield reward.name, evaluate.dataset, f"stages.{stage_name}.rewards.{i}"
