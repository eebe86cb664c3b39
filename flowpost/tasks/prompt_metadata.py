"""Before anything runs: the prompt files a reward or metric scores are well formed, every row holds the metadata
it reads, and every prompt is one it can score (``ocr``: a prompt quoting the text to render)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from flowpost.core.config.schema.datasets import PromptFilesDataset
from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.core.evaluation.registry import metric_class, metric_metadata_fields
from flowpost.core.rewards.metadata_fields import check_metadata_fields
from flowpost.data.prompt_files import PromptSet, read_prompt_files
from flowpost.errors import FlowpostError


def prompt_metadata_problems(pipeline: PipelineConfig) -> list[str]:
    """``where: message`` for each malformed row (named by its file and line), each reward or metric whose
    prompt-files dataset has a row without a metadata field it reads (``metadata_fields``), and each prompt a
    scorer's ``prompt_problem`` refuses (named by its file and line); a path that does not exist yet is left to
    the dataset's acquisition."""
    problems: list[str] = []
    read: dict[str, PromptSet | None] = {}
    for name, dataset_name, where in _scorers(pipeline):
        dataset = pipeline.datasets.get(dataset_name)
        if not isinstance(dataset, PromptFilesDataset) or not Path(dataset.path).exists():
            continue
        try:
            if dataset_name not in read:
                read[dataset_name] = None
                read[dataset_name] = read_prompt_files(dataset.path, where=f"datasets.{dataset_name}.path")
            if (prompts := read[dataset_name]) is None:
                continue  # its malformed row is reported already
            rows = ((record.prompt, record.metadata) for record in prompts.records)
            check_metadata_fields(
                name, metric_metadata_fields(name, where=where), rows, dataset=dataset_name, where=where
            )
            _check_prompts(name, prompts, where=where)
        except FlowpostError as exc:
            if str(exc) not in problems:
                problems.append(str(exc))
    return problems


def _check_prompts(name: str, prompts: PromptSet, *, where: str) -> None:
    """Refuse the first prompt the scorer ``name`` declares unscorable (its class's ``prompt_problem``), naming
    the scorer's entry and the prompt's file and line."""
    problem_of = getattr(metric_class(name, where=where), "prompt_problem", None)
    if problem_of is None:
        return
    for record, place in zip(prompts.records, prompts.places, strict=True):
        if problem := problem_of(record.prompt):
            raise FlowpostError(f"{place}: {problem} (prompt {record.prompt!r})", where=where)


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
