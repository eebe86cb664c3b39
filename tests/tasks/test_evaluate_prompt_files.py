"""Evaluating on prompt files: a separate file of test prompts is evaluated (every prompt), and every
combination that cannot evaluate is refused by ``flowpost validate`` with advice that validates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_main import Outcome, flowpost_main

TEST_PROMPTS = ["a handwritten digit three", "a handwritten digit eight"]


def _pipeline(tiny_pipeline: Any, tmp_path: Path) -> dict[str, Any]:
    """The tiny pipeline plus a GRPO stage rolling out a prompt file, evaluated on that prompt dataset."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"a handwritten digit {d}", "label": d}) + "\n" for d in range(3)))
    config = tiny_pipeline()
    config["datasets"]["prompts"] = {"source": "prompt-files", "path": str(train)}
    config["conditions"]["rl"] = {"encoder": "minilm", "datasets": ["digits", "prompts"]}
    config["stages"]["grpo"] = {
        "trainer": "grpo",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "digits", "conditions": "rl", "prompts": "prompts"},
        "rewards": [{"name": "mean_brightness"}],
        "train": {"iterations": 1, "prompts_per_iteration": 2, "group_size": 2},
    }
    config["evaluate"] = {
        "after": ["grpo"],
        "dataset": "prompts",
        "conditions": "rl",
        "metrics": ["saturation"],
        "samples": 4,
        "steps": 2,
        "batch_size": 4,
    }
    config["export"] = {"from": "grpo"}
    return config


def _validate(config: dict[str, Any], tmp_path: Path) -> Outcome:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return flowpost_main("validate", str(path))


def _refused(outcome: Outcome, where: str) -> str:
    assert outcome.code == 1 and "Traceback" not in outcome.stdout + outcome.stderr, outcome
    assert f"{where}: " in outcome.stderr, outcome.stderr
    return outcome.stderr


def _test_prompts(config: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """The advice followed: a file of test prompts of its own, encoded by the evaluation's cache."""
    test = tmp_path / "test.txt"
    test.write_text("\n".join(TEST_PROMPTS) + "\n")
    config["datasets"]["test_prompts"] = {"source": "prompt-files", "path": str(test)}
    config["conditions"]["rl"]["datasets"].append("test_prompts")
    config["evaluate"]["dataset"] = "test_prompts"
    return config


def test_evaluating_on_the_training_prompts_is_refused_with_advice_that_validates(tiny_pipeline, tmp_path) -> None:
    config = _pipeline(tiny_pipeline, tmp_path)
    message = _refused(_validate(config, tmp_path), "evaluate.dataset")
    assert "holds training prompts (stages.grpo.data.prompts reads them)" in message
    assert "split.eval" not in message  # prompt-files have no split
    assert "datasets.test_prompts: {source: prompt-files, path: prompts/test.txt}" in message
    assert "list test_prompts in conditions.rl.datasets and set evaluate.dataset: test_prompts" in message
    outcome = _validate(_test_prompts(config, tmp_path), tmp_path)
    assert outcome.code == 0, outcome.stderr


@pytest.mark.parametrize(
    ("change", "where", "words"),
    [
        ({"metrics": ["saturation", "fd_clip"]}, "evaluate.metrics.1", "held-out real images"),
        ({"conditions": "minilm"}, "evaluate.conditions", "cache 'minilm' does not encode dataset 'test_prompts'"),
    ],
    ids=["reference-metric", "cache-without-the-prompts"],
)
def test_a_test_prompt_dataset_the_evaluation_cannot_use_is_refused(tiny_pipeline, tmp_path, change, where, words):
    config = _test_prompts(_pipeline(tiny_pipeline, tmp_path), tmp_path)
    config["evaluate"].update(change)
    assert words in _refused(_validate(config, tmp_path), where)


@pytest.mark.slow  # about a minute: acquisition, conditions, two training stages, the evaluation and the export
def test_a_run_evaluates_every_test_prompt_then_exports(tiny_pipeline, tmp_path: Path) -> None:
    config = _test_prompts(_pipeline(tiny_pipeline, tmp_path), tmp_path)
    pipeline, workspace = tmp_path / "pipeline.yaml", tmp_path / "ws"
    pipeline.write_text(yaml.safe_dump(config, sort_keys=False))
    nodes = ["acquire.digits", "acquire.prompts", "acquire.test_prompts", "conditions.minilm", "conditions.rl"]
    written = {}
    for node in [*nodes, "train.sft", "train.grpo", "eval.grpo", "export"]:
        outcome = flowpost_main("run-node", node, "-p", str(pipeline), "-w", str(workspace))
        assert outcome.code == 0, (node, outcome.stderr)
        written[node] = Path(outcome.stdout.strip().splitlines()[-1].rpartition(" -> ")[2])
    metrics = json.loads((written["eval.grpo"] / "metrics.json").read_text())
    assert metrics["n_samples"] == 4 and 0.0 <= metrics["saturation"] <= 1.0
    assert (written["export"] / "export.json").is_file()
