"""A prompt folder is a source: its contents fingerprint the nodes that read it, and new prompts rerun
exactly those (the acquisition, its condition cache, the stage that rolls them out, and downstream)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowpost.core.config.loading import validate_pipeline
from flowpost.data.stage_inputs import load_stage_inputs
from flowpost.errors import FlowpostError
from flowpost.tasks.dvc import dvc_stages
from flowpost.tasks.plan import plan_run
from flowpost.tasks.runner import PROMPT_FILES, PipelineRun

ROLLED_OUT = {"acquire.prompts", "conditions.rl", "train.grpo", "eval.grpo", "export", "report"}


def _pipeline(tiny_pipeline, folder: Path) -> dict:
    config = tiny_pipeline()
    config["datasets"]["prompts"] = {"source": "prompt-files", "path": str(folder)}
    config["conditions"]["rl"] = {"encoder": "minilm", "datasets": ["digits", "prompts"]}
    config["stages"]["grpo"] = {
        "trainer": "grpo",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "digits", "conditions": "rl", "prompts": "prompts"},
        "rewards": [{"name": "digit_adherence"}],
        "sampling": {"steps": 3},
        "train": {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 8},
    }
    config["evaluate"]["after"] = ["sft", "grpo"]
    config["export"] = {"from": "grpo"}
    return config


def _prompt_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "prompts"
    folder.mkdir()
    rows = [{"prompt": "a drawing of the digit 7", "label": 7}, {"prompt": "a drawing of the digit 1", "label": 1}]
    (folder / "first.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_new_prompt_files_rerun_exactly_the_nodes_that_read_them(tiny_pipeline, tmp_path: Path) -> None:
    folder = _prompt_folder(tmp_path)
    pipeline = validate_pipeline(_pipeline(tiny_pipeline, folder))
    before = PipelineRun(pipeline, tmp_path / "ws")
    assert "acquire.prompts" in before.nodes["train.grpo"].deps
    assert set(before.inputs["acquire.prompts"]["sources"]) == {PROMPT_FILES}
    assert PipelineRun(pipeline, tmp_path / "ws").fingerprints == before.fingerprints

    (folder / "second.txt").write_text("a drawing of the digit 4\n")
    after = PipelineRun(pipeline, tmp_path / "ws")
    assert {node for node in before.fingerprints if before.fingerprints[node] != after.fingerprints[node]} == ROLLED_OUT


def test_a_grpo_stage_rolls_out_the_folder_prompts_and_reruns_when_it_changes(tiny_pipeline, tmp_path: Path) -> None:
    folder = _prompt_folder(tmp_path)
    run = PipelineRun(validate_pipeline(_pipeline(tiny_pipeline, folder)), tmp_path / "ws")
    assert {run.execute(node).status for node in run.nodes} == {"ran"}
    inputs = load_stage_inputs(run.train_spec("grpo", tmp_path / "unused"))
    assert inputs.prompts == [("a drawing of the digit 7", {"label": 7}), ("a drawing of the digit 1", {"label": 1})]
    assert len(inputs.conditions.lookup([p for p, _ in inputs.prompts])) == 2  # the rl cache encoded them
    assert (run.path("train.grpo") / "final" / "live").is_dir()

    (folder / "second.jsonl").write_text(json.dumps({"prompt": "a drawing of the digit 4", "label": 4}) + "\n")
    again = PipelineRun(validate_pipeline(_pipeline(tiny_pipeline, folder)), tmp_path / "ws")
    reasons = {row.node: row.reason for row in plan_run(again)}
    assert reasons["acquire.prompts"].startswith("prompt files changed (")
    ran = {node for node in again.nodes if again.execute(node).status == "ran"}
    assert ran == ROLLED_OUT
    prompts = load_stage_inputs(again.train_spec("grpo", tmp_path / "unused")).prompts
    assert [p for p, _ in prompts][-1] == "a drawing of the digit 4"


def test_dvc_tracks_the_prompt_path_as_a_dependency(tiny_pipeline, tmp_path: Path) -> None:
    folder = _prompt_folder(tmp_path)
    stages = dvc_stages(validate_pipeline(_pipeline(tiny_pipeline, folder)))["stages"]
    assert str(folder) in stages["acquire.prompts"]["deps"]
    assert "workspace/data/prompts" in stages["train.grpo"]["deps"]


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        (lambda c: c["datasets"]["prompts"].pop("path"), "datasets.prompts", "'path' is required"),
        (
            lambda c: c["stages"]["grpo"]["data"].update(prompts="digits"),
            "stages.grpo.data.prompts",
            "not a 'prompt-files' source",
        ),
        (
            lambda c: c["conditions"]["rl"].update(datasets=["digits"]),
            "stages.grpo.data.conditions",
            "does not encode dataset 'prompts'",
        ),
        (
            lambda c: c["stages"]["sft"]["data"].update(prompts="prompts", conditions="rl"),
            "stages.sft.data.prompts",
            "reads a dataset, not prompts",
        ),
        (
            lambda c: c["evaluate"].update(dataset="prompts"),
            "evaluate.metrics",
            "name the metrics for dataset 'prompts'",
        ),
        (
            lambda c: c["stages"]["sft"]["data"].update(dataset="prompts", conditions="rl"),
            "stages.sft.data.dataset",
            "holds prompts only",
        ),
    ],
)
def test_misused_prompt_sets_are_rejected_with_their_config_path(tiny_pipeline, tmp_path, change, path, message):
    config = _pipeline(tiny_pipeline, tmp_path)
    change(config)
    with pytest.raises(FlowpostError, match=message) as info:
        validate_pipeline(config)
    assert path in str(info.value)
