"""Property-based hostile input: valid pipelines mutated at every level are accepted or rejected
with the flowpost error, and `flowpost run` on a rejected file writes nothing."""

from __future__ import annotations

import contextlib
import copy
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from flowpost.cli import app
from flowpost.core.config.loading import default_pipeline_path, load_pipeline, pipeline_to_dict, read_yaml
from flowpost.core.config.schema import PipelineConfig
from flowpost.errors import FlowpostError

TINY_TRANSFORMER = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}
TINY = {
    "name": "tiny",
    "smoke": True,
    "datasets": {"digits": {"source": "builtin-digits"}},
    "conditions": {"minilm": {"encoder": "minilm", "datasets": ["digits"]}},
    "stages": {
        "sft": {
            "trainer": "sft",
            "model": {"family": "tiny-sd3", "transformer": TINY_TRANSFORMER},
            "data": {"dataset": "digits", "conditions": "minilm"},
            "train": {"lr": 1e-3, "batch_size": 8, "max_steps": 3},
        }
    },
    "evaluate": {"after": ["sft"], "samples": 20, "steps": 2, "batch_size": 10},
    "export": {"from": "sft"},
}
BASES = {"tiny": TINY, "digits": read_yaml(default_pipeline_path())}

# wrong types, out-of-range numbers, names no registry knows, and values YAML allows but a config must not
HOSTILE = [
    None,
    True,
    "",
    "x",
    "sftt",
    "tiny-sd4",
    "builtin-digitz",
    "digit_adherance",
    "1e-4",
    "../outside",
    -1,
    0,
    1,
    2**63,
    10**12,
    -1e-4,
    1e308,
    math.inf,
    -math.inf,
    math.nan,
    [],
    ["x"],
    [1, 2],
    {},
    {"x": 1},
]
EXTRA_KEYS = ["extra", "lrr", "Trainer", "from", "name", "model", "1", "ema"]
DEFAULT = settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
BIG = settings(max_examples=600, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``node`` (mapping keys and list indices), the root included."""
    found = [prefix]
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in children:
        found += _paths(child, (*prefix, key))
    return found


def _at(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


@st.composite
def mutated_pipelines(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    """A valid pipeline with one to three keys dropped, values replaced or keys added; and what was done."""
    data = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    done = []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(data)))
        node = _at(data, path)
        operations = (["drop", "replace"] if path else []) + (["extra"] if isinstance(node, dict) else [])
        operation = draw(st.sampled_from(operations))
        if operation == "extra":
            key = draw(st.sampled_from(EXTRA_KEYS))
            node[key] = copy.deepcopy(draw(st.sampled_from(HOSTILE)))
            path = (*path, key)
        elif operation == "drop":
            del _at(data, path[:-1])[path[-1]]
        else:
            _at(data, path[:-1])[path[-1]] = copy.deepcopy(draw(st.sampled_from(HOSTILE)))
        done.append(f"{operation} {'.'.join(map(str, path))}")
    return data, done


def _load_or_error(path: Path) -> PipelineConfig | FlowpostError:
    """The loaded pipeline, or the flowpost error it raised; any other exception fails the test."""
    try:
        return load_pipeline(path)
    except FlowpostError as error:
        return error


def _check_loader(data: dict[str, Any], folder: Path) -> PipelineConfig | FlowpostError:
    file = folder / "pipeline.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    result = _load_or_error(file)
    if isinstance(result, FlowpostError):
        message = str(result)
        assert message.startswith(f"{file}") and "Traceback" not in message, message
    else:  # what an accepted file resolves to (params.yaml) loads as the same pipeline
        file.write_text(yaml.safe_dump(pipeline_to_dict(result), sort_keys=False))
        assert load_pipeline(file) == result
    return result


@contextlib.contextmanager
def _fresh_folder() -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


@DEFAULT
@given(mutated_pipelines())
def test_a_mutated_pipeline_is_accepted_or_rejected_with_the_flowpost_error(case: tuple[dict, list[str]]) -> None:
    with _fresh_folder() as folder:
        _check_loader(case[0], folder)


@pytest.mark.slow
@BIG
@given(mutated_pipelines())
def test_many_mutated_pipelines_are_accepted_or_rejected_with_the_flowpost_error(case: tuple[dict, list[str]]) -> None:
    with _fresh_folder() as folder:
        _check_loader(case[0], folder)


@DEFAULT
@given(st.data())
def test_a_damaged_pipeline_text_is_accepted_or_rejected_with_the_flowpost_error(data: st.DataObject) -> None:
    text = default_pipeline_path().read_text()
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, min(len(text), start + 40)))
    insert = data.draw(st.text(alphabet=":{}[]-#&*!|>'\"%@`\t\n ,?=", max_size=3))
    with _fresh_folder() as folder:
        file = folder / "pipeline.yaml"
        file.write_text(text[:start] + insert + text[end:])
        result = _load_or_error(file)
        if isinstance(result, FlowpostError):
            assert str(result).startswith(f"{file}"), str(result)


def _run_in(folder: Path, data: dict[str, Any]) -> tuple[FlowpostError | None, Any]:
    """Write ``data`` into an otherwise empty ``folder``; run `flowpost run` there if the loader rejects it."""
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with contextlib.chdir(folder):
        result = _load_or_error(Path("pipeline.yaml"))
        if not isinstance(result, FlowpostError):
            return None, None
        outcome = CliRunner().invoke(app, ["run", "pipeline.yaml", "--workspace", "ws"])
    return result, outcome


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_pipelines())
def test_flowpost_run_on_a_rejected_file_writes_nothing(case: tuple[dict, list[str]]) -> None:
    with _fresh_folder() as folder:
        error, outcome = _run_in(folder, case[0])
        if error is not None:
            assert outcome.exit_code != 0 and isinstance(outcome.exception, FlowpostError)
            assert str(outcome.exception) == str(error)
            assert sorted(p.name for p in folder.iterdir()) == ["pipeline.yaml"]


@pytest.mark.slow
@settings(max_examples=8, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_pipelines())
def test_the_flowpost_command_on_a_rejected_file_prints_one_error_and_writes_nothing(
    case: tuple[dict, list[str]],
) -> None:
    with _fresh_folder() as folder:
        (folder / "pipeline.yaml").write_text(yaml.safe_dump(case[0], sort_keys=False))
        if not isinstance(_load_or_error(folder / "pipeline.yaml"), FlowpostError):
            return
        env = {**os.environ, "PREFECT_HOME": str(folder / "prefect-home")}
        done = subprocess.run(
            [sys.executable, "-m", "flowpost.cli", "run", "pipeline.yaml", "--workspace", "ws"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1 and done.stderr.startswith("error: pipeline.yaml"), done.stderr
        assert "Traceback" not in done.stderr
        assert sorted(p.name for p in folder.iterdir()) == ["pipeline.yaml"]
