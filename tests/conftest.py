"""Shared fixtures: quiet analytics, a tiny pipeline, a Prefect test server for the session."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="flowpost-prefect-"))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["DVC_NO_ANALYTICS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_TRANSFORMER = {
    "num_layers": 1,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "caption_projection_dim": 16,
}


def tiny_pipeline_dict(**train: Any) -> dict[str, Any]:
    """A small pipeline: digits, MiniLM cache, a tiny SFT stage, a short eval, export, report."""
    return {
        "name": "tiny",
        "seed": 0,
        "smoke": True,
        "datasets": {"digits": {"source": "builtin-digits"}},
        "conditions": {"minilm": {"encoder": "minilm", "datasets": ["digits"]}},
        "stages": {
            "sft": {
                "trainer": "sft",
                "model": {"family": "tiny-sd3", "transformer": dict(TINY_TRANSFORMER)},
                "data": {"dataset": "digits", "conditions": "minilm"},
                "train": {
                    "lr": 1e-3,
                    "batch_size": 8,
                    "max_steps": 3,
                    "checkpoint_every": 2,
                    **train,
                },
                "callbacks": {"ema": {"decay": 0.9}, "grad_clip": {"max_norm": 1.0}},
            }
        },
        "evaluate": {"after": ["sft"], "samples": 20, "steps": 2, "batch_size": 10},
        "export": {"from": "sft"},
    }


@pytest.fixture(scope="session")
def tiny_pipeline():  # noqa: ANN201
    """Factory of tiny pipeline mappings; keyword arguments override ``stages.sft.train``."""
    return tiny_pipeline_dict


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
