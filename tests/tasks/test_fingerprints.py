"""Which config edits change which node fingerprints (pure: nothing runs)."""

from __future__ import annotations

import copy
from typing import Any

from flowpost.core.config.loading import validate_pipeline
from flowpost.tasks.graph import NodeKind, build_nodes, fingerprint_inputs, fingerprints


def _prints(config: dict[str, Any]) -> dict[str, str]:
    return fingerprints(build_nodes(validate_pipeline(config)), code="code")


def _two_stages(tiny_pipeline) -> dict[str, Any]:
    config = tiny_pipeline()
    config["stages"]["other"] = copy.deepcopy(config["stages"]["sft"])
    return config


def test_adding_a_stage_to_evaluate_after_leaves_other_evaluations_alone(tiny_pipeline) -> None:
    config = _two_stages(tiny_pipeline)
    before = _prints(config)
    config["evaluate"]["after"] = ["sft", "other"]
    after = _prints(config)
    assert "eval.other" in after and "eval.other" not in before
    for node in ("eval.sft", "train.sft", "train.other", "export"):
        assert after[node] == before[node], node
    assert after["report"] != before["report"]  # it gathers one more evaluation


def test_trackers_do_not_change_the_training_fingerprint(tiny_pipeline) -> None:
    config = tiny_pipeline()
    before = _prints(config)
    config["stages"]["sft"]["callbacks"]["trackers"] = ["tensorboard", "dvclive"]
    assert _prints(config) == before
    config["stages"]["sft"]["callbacks"]["ema"] = {"decay": 0.5}
    assert _prints(config)["train.sft"] != before["train.sft"]


def test_a_learning_rate_changes_its_stage_and_everything_downstream_only(tiny_pipeline) -> None:
    config = tiny_pipeline()
    before = _prints(config)
    config["stages"]["sft"]["train"]["lr"] = 5e-4
    after = _prints(config)
    for node in ("train.sft", "eval.sft", "export", "report"):
        assert after[node] != before[node], node
    for node in ("acquire.digits", "conditions.minilm"):
        assert after[node] == before[node], node


def test_every_node_kind_has_a_handler_and_fingerprints_record_it_as_text(tiny_pipeline) -> None:
    from flowpost.tasks.runner import HANDLERS

    assert set(HANDLERS) == set(NodeKind)
    nodes = build_nodes(validate_pipeline(tiny_pipeline()))
    inputs = fingerprint_inputs(nodes, code="code")
    assert [inputs[node.id]["kind"] for node in nodes] == [node.id.split(".")[0] for node in nodes]
    assert all(type(value["kind"]) is str for value in inputs.values())  # the enum's text, as before it existed
