"""One hostile case through the real command: exit 1, one ``error:`` line naming the place, no traceback, and
nothing in the workspace but the lock and the failed node's attempt record."""

from __future__ import annotations

from pathlib import Path

from cli_main import Outcome, flowpost_main

ATTEMPT_ONLY = {"_attempt.json"}  # a node that fails keeps the record of its attempt, never an output
TINY_SFT = {
    "trainer": "sft",
    "model": {
        "family": "tiny-sd3",
        "transformer": {
            "num_layers": 1,
            "num_attention_heads": 2,
            "attention_head_dim": 8,
            "caption_projection_dim": 16,
        },
    },
    "data": {"dataset": "digits", "conditions": "minilm"},
    "train": {"lr": 1e-3, "batch_size": 8, "max_steps": 3},
}


def pipeline_with(datasets: dict) -> dict:
    """The smallest valid pipeline holding ``datasets`` beside the digits its one stage trains on."""
    return {
        "name": "hostile",
        "datasets": {"digits": {"source": "builtin-digits"}, **datasets},
        "conditions": {"minilm": {"encoder": "minilm", "datasets": ["digits"]}},
        "stages": {"sft": TINY_SFT},
        "evaluate": {"after": []},
    }


def refused(*args: str, naming: str) -> Outcome:
    """``flowpost ARGS`` exits 1 with one error line that contains ``naming``, and no traceback."""
    outcome = flowpost_main(*args)
    assert outcome.code == 1, outcome
    assert "Traceback" not in outcome.stdout + outcome.stderr, outcome.stderr
    assert outcome.stderr.startswith("error: ") and outcome.stderr.count("error:") == 1, outcome.stderr
    assert naming in outcome.stderr, outcome.stderr
    return outcome


def nothing_written(workspace: Path) -> None:
    """The workspace holds no node output: at most the lock and failed attempts' records."""
    if not workspace.exists():
        return
    written = {
        p.relative_to(workspace).as_posix()
        for p in workspace.rglob("*")
        if p.is_file() and p.name not in ATTEMPT_ONLY and p.name != ".flowpost.lock"
    }
    assert written == set(), written
