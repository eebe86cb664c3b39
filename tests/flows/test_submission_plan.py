"""Heavy nodes (train, eval) are chained so that only one runs at a time."""

from __future__ import annotations

import copy
import itertools

from flowpost.core.config.loading import validate_pipeline
from flowpost.flows.pipeline import HEAVY_KINDS, submission_plan
from flowpost.tasks.graph import build_nodes


def test_each_heavy_node_waits_for_the_previous_heavy_node(tiny_pipeline) -> None:
    config = tiny_pipeline()
    config["stages"]["other"] = copy.deepcopy(config["stages"]["sft"])  # independent of sft
    config["evaluate"]["after"] = ["sft", "other"]
    nodes = {node.id: node for node in build_nodes(validate_pipeline(config))}
    plan = submission_plan(nodes)
    assert list(plan) == list(nodes)
    heavy = [node_id for node_id, node in nodes.items() if node.kind in HEAVY_KINDS]
    assert heavy == ["train.sft", "train.other", "eval.sft", "eval.other"]
    for before, after in itertools.pairwise(heavy):
        assert before in plan[after]
    for node_id, node in nodes.items():
        assert set(node.deps) <= set(plan[node_id])
        if node.kind not in HEAVY_KINDS:
            assert plan[node_id] == list(node.deps)
    assert plan["train.sft"] == list(nodes["train.sft"].deps)
