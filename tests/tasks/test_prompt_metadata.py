"""``flowpost validate`` refuses a prompt-files dataset whose rows lack the metadata a reward or metric reads,
or hold malformed GenEval checks, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from cli_main import Outcome, flowpost_main

GENEVAL = {"name": "geneval", "options": {"detector": "unused", "clip": "unused"}}  # built only when a stage runs
CAT = {"prompt": "a photo of a cat", "tag": "single_object", "include": [{"class": "cat", "count": 1}]}


def _validate(tiny_pipeline: Any, tmp_path: Path, rows: list[dict[str, Any]]) -> Outcome:
    """The tiny pipeline plus a GRPO stage rolling out ``rows``, rewarded by geneval."""
    prompts = tmp_path / "geneval.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tiny_pipeline()
    config["datasets"]["geneval"] = {"source": "prompt-files", "path": str(prompts)}
    config["conditions"]["rl"] = {"encoder": "minilm", "datasets": ["digits", "geneval"]}
    config["stages"]["grpo"] = {
        "trainer": "grpo",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "digits", "conditions": "rl", "prompts": "geneval"},
        "rewards": [GENEVAL],
        "train": {"iterations": 1, "prompts_per_iteration": 2, "group_size": 2},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return flowpost_main("validate", str(path))


def test_geneval_prompts_with_their_metadata_validate(tiny_pipeline, tmp_path: Path) -> None:
    outcome = _validate(tiny_pipeline, tmp_path, [CAT, {**CAT, "prompt": "a cat"}])
    assert outcome.code == 0, outcome.stderr


def test_a_prompt_without_the_metadata_is_refused_naming_reward_dataset_prompt_and_field(tiny_pipeline, tmp_path):
    outcome = _validate(tiny_pipeline, tmp_path, [CAT, {"prompt": "a dog", "tag": "single_object"}])
    assert outcome.code == 1 and "Traceback" not in outcome.stderr
    assert (
        "stages.grpo.rewards.0: reward 'geneval' reads the metadata field 'include' of every prompt, and prompt "
        "'a dog' of dataset 'geneval' has none"
    ) in " ".join(outcome.stderr.split())


def test_a_malformed_geneval_row_is_refused_naming_its_file_and_line(tiny_pipeline, tmp_path: Path) -> None:
    bad = {**CAT, "include": [{"class": "cat", "count": 1, "color": "teal"}]}
    outcome = _validate(tiny_pipeline, tmp_path, [CAT, bad])
    assert outcome.code == 1 and "Traceback" not in outcome.stderr
    assert f"{tmp_path / 'geneval.jsonl'}:2: include.0.color is 'teal'" in " ".join(outcome.stderr.split())
