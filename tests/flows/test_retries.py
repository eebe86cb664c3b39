"""Transient failures (a reward server that does not answer) are retried; other failures are not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flowpost.errors import FlowpostError


def failing_first(failures: int, status: int):  # noqa: ANN201
    """Answers the first ``failures`` requests with ``status``, then scores samples by prompt length."""
    answered: list[int] = []

    def answer(request: dict) -> tuple[int, dict]:
        code = status if len(answered) < failures else 200
        answered.append(code)
        return code, ({"scores": [float(len(p)) for p in request["prompts"]]} if code == 200 else {"error": "busy"})

    answer.answered = answered  # type: ignore[attr-defined]
    return answer


def _with_remote_grpo(config: dict[str, Any], url: str) -> dict[str, Any]:
    config["stages"]["grpo"] = {
        "trainer": "grpo",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "sampling": {"steps": 3},
        "rewards": [{"name": "remote", "options": {"url": url, "retries": 0, "version": "v1"}}],
        "train": {
            "lr": 1e-4,
            "iterations": 2,
            "prompts_per_iteration": 2,
            "group_size": 4,
            "rollout_batch_size": 8,
            "train_batch_size": 8,
        },
    }
    config["export"] = {"from": "grpo"}
    return config


@pytest.mark.slow
def test_a_transiently_failing_node_is_retried_and_completes(
    prefect_harness, tiny_pipeline, json_server, tmp_path: Path
) -> None:
    from flowpost.flows.pipeline import pipeline_flow

    answer = failing_first(1, 503)
    with json_server(answer) as url:
        results = pipeline_flow(_with_remote_grpo(tiny_pipeline(), url), str(tmp_path), retry_delay_seconds=0.0)
    assert {r.node: r.status for r in results}["train.grpo"] == "ran"
    assert answer.answered[0] == 503 and answer.answered[1:] and set(answer.answered[1:]) == {200}
    assert json.loads((tmp_path / "metrics.json").read_text())["sft"]["step"] == 3


@pytest.mark.slow
def test_a_rejected_request_is_not_retried(prefect_harness, tiny_pipeline, json_server, tmp_path: Path) -> None:
    from flowpost.flows.pipeline import pipeline_flow

    answer = failing_first(100, 400)
    with json_server(answer) as url:
        with pytest.raises(FlowpostError, match="train.grpo failed.*HTTP 400"):
            pipeline_flow(_with_remote_grpo(tiny_pipeline(), url), str(tmp_path), retry_delay_seconds=0.0)
    assert answer.answered == [400]


@pytest.mark.slow
def test_a_reward_server_going_down_mid_stage_fails_it_resumably(
    prefect_harness, tiny_pipeline, json_server, tmp_path: Path
) -> None:
    """Up for two iterations, then answering 503: the node fails after its retries with the last
    checkpoint kept; with the server back, the next run resumes from that checkpoint."""
    from flowpost.core.config.loading import validate_pipeline
    from flowpost.core.events import read_events
    from flowpost.flows.pipeline import pipeline_flow
    from flowpost.tasks.runner import PipelineRun

    down_after = {"requests": 2}
    served: list[int] = []

    def answer(request: dict) -> tuple[int, dict]:
        code = 503 if len([c for c in served if c == 200]) >= down_after["requests"] else 200
        served.append(code)
        return code, ({"scores": [float(len(p)) for p in request["prompts"]]} if code == 200 else {"error": "down"})

    with json_server(answer) as url:
        config = _with_remote_grpo(tiny_pipeline(), url)
        config["smoke"] = False  # the smoke profile would cut the four iterations to fewer
        config["stages"]["grpo"]["train"].update(iterations=4, checkpoint_every=1)
        with pytest.raises(FlowpostError, match=r"train.grpo failed.*HTTP 503"):
            pipeline_flow(config, str(tmp_path), retries=1, retry_delay_seconds=0.0)
        stage = PipelineRun(validate_pipeline(config), tmp_path).path("train.grpo")
        assert (stage / "checkpoints" / "latest").exists()
        down_after["requests"] = 10**6  # the server is back
        results = pipeline_flow(config, str(tmp_path), retry_delay_seconds=0.0)
    assert {r.node: r.status for r in results}["train.grpo"] == "ran"
    starts = [e for e in read_events(stage / "events.jsonl") if e["event"] == "start"]
    assert starts[0]["resumed_from"] is None and starts[-1]["resumed_from"] is not None
    assert served.count(200) == 4  # two iterations before the outage, the other two after it
