"""A remote reward server's model version is part of the fingerprint of the stages it rewards."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.rewards.registry import build_reward
from flowpost.core.rewards.remote import RemoteReward
from flowpost.core.rewards.server import RewardServer, serve_reward
from flowpost.errors import FlowpostError
from flowpost.tasks.runner import PipelineRun


def _served(version: str, port: int = 0) -> RewardServer:
    return serve_reward(build_reward("jpeg_incompressibility", options={}, where="test"), port=port, version=version)


def _pipeline(tiny_pipeline, options: dict) -> object:
    config = tiny_pipeline()
    config["stages"]["grpo"] = {
        "trainer": "grpo",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "rewards": [{"name": "remote", "options": options}],
        "train": {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 8},
    }
    config["export"] = {"from": "grpo"}
    return validate_pipeline(config)


def test_a_new_served_version_reruns_exactly_the_stages_it_rewards(tiny_pipeline, tmp_path: Path) -> None:
    first = _served("model-a")
    pipeline = _pipeline(tiny_pipeline, {"url": first.url})
    with first.running():
        assert RemoteReward(first.url).served_version() == "model-a"
        before = PipelineRun(pipeline, tmp_path).fingerprints
        assert PipelineRun(pipeline, tmp_path).fingerprints == before
    redeployed = _served("model-b", port=first.port)
    with redeployed.running():  # the same address, another model
        after = PipelineRun(pipeline, tmp_path).fingerprints
        changed = {node for node in before if before[node] != after[node]}
        assert changed == {"train.grpo", "export", "report"}
        assert PipelineRun(pipeline, tmp_path).inputs["train.grpo"]["sources"] == {"rewards.0": "model-b"}


def test_a_pinned_version_needs_no_server(tiny_pipeline, tmp_path: Path) -> None:
    pinned = _pipeline(tiny_pipeline, {"url": "http://127.0.0.1:9/score", "version": "v7"})
    assert PipelineRun(pinned, tmp_path).inputs["train.grpo"]["sources"] == {"rewards.0": "v7"}


def test_an_unreachable_unpinned_server_is_named_with_the_fix(tiny_pipeline, tmp_path: Path) -> None:
    pipeline = _pipeline(tiny_pipeline, {"url": "http://127.0.0.1:9/score", "retries": 0, "timeout": 2})
    with pytest.raises(
        FlowpostError, match=r"stages\.grpo\.rewards\.0.*pin it with stages\.grpo\.rewards\.0\.options\.version"
    ):
        PipelineRun(pipeline, tmp_path)
