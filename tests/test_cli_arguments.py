"""Every `flowpost` command given missing, wrong-typed or contradictory arguments: a non-zero exit,
one message naming the argument or path, no traceback, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_main import flowpost_main
from typer.main import get_command

from flowpost.cli import app
from flowpost.core.config.loading import default_pipeline_path

DIGITS = str(default_pipeline_path())
UNSET = "FLOWPOST_TEST_TOKEN_NEVER_SET"
USAGE = 2  # click's exit status for arguments it cannot parse
ERROR = 1  # a FlowpostError

# (arguments, exit status, text the message must hold); the working folder holds `a-file` (a file)
# and `empty/` (a folder), and every path below is relative to it
CASES: dict[str, list[tuple[list[str], int, str]]] = {
    "run": [
        (["run", "missing.yaml"], ERROR, "missing.yaml: pipeline file not found"),
        (["run", "--retries", "many"], USAGE, "'--retries'"),
        (["run", "--retry-delay", "-1"], USAGE, "'--retry-delay'"),
        (["run", "--set", "stages.sft.train.lr=fast"], ERROR, "stages.sft.train.lr"),
        (["run", "--set", "seed"], ERROR, "--set: override 'seed' must look like dotted.path=value"),
        (["run", "--main-process-port", "70000"], USAGE, "'--main-process-port'"),
        (["run", "--num-machines", "0"], USAGE, "'--num-machines'"),
        (["run", "--num-machines", "2", "--machine-rank", "2"], ERROR, "--machine-rank: machine rank 2 is outside"),
        (["run", "--machine-rank", "1"], ERROR, "--machine-rank: machine rank 1 is outside 0..0"),
        (["run", "--workspace", "a-file"], ERROR, "the workspace is a file"),
        (["run", "--workspace", "a-file/ws"], ERROR, "the workspace lies under the file"),
        (["run", "a-file"], ERROR, "a-file: a pipeline file must be a YAML mapping"),
        (["run", "empty"], ERROR, "empty: this is a folder; give the pipeline YAML file"),
    ],
    "serve": [
        (["serve", "missing.yaml"], ERROR, "missing.yaml: pipeline file not found"),
        (["serve", "--cron", "every night"], ERROR, "--cron: invalid cron expression 'every night'"),
        (["serve", "--name", "a/b"], ERROR, "--name: 'a/b' is not a usable name"),
        (["serve", "--workspace", "a-file/ws"], ERROR, "the workspace lies under the file"),
    ],
    "deploy": [
        (["deploy"], USAGE, "'--pool'"),
        (["deploy", "--pool", ""], ERROR, "--pool: '' is not a usable name"),
        (["deploy", "--pool", "p", "--cron", "61 * * * *"], ERROR, "--cron: invalid cron expression"),
        (["deploy", "--pool", "p", "--workspace", "a-file"], ERROR, "the workspace is a file"),
        (["deploy", "--pool", "p", "missing.yaml"], ERROR, "missing.yaml: pipeline file not found"),
    ],
    "plan": [
        (["plan", "missing.yaml"], ERROR, "missing.yaml: pipeline file not found"),
        (["plan", "--set", "seed=zero"], ERROR, "seed: Input should be a valid integer"),
        (["plan", "--workspace", "a-file"], ERROR, "the workspace is a file"),
        (["plan", "--num-machines", "2"], USAGE, "--num-machines"),
    ],
    "run-node": [
        (["run-node"], USAGE, "Missing argument 'node'"),
        (["run-node", "train.nope"], ERROR, "NODE: unknown node 'train.nope'"),
        (["run-node", "train.sft", "--folders", "flat"], ERROR, "--folders: unknown folders 'flat'"),
        (["run-node", "train.sft"], ERROR, "node train.sft needs acquire.digits, which has not completed"),
        (["run-node", "report", "--folders", "fixed"], ERROR, "node report needs eval.sft, which has not completed"),
        (["run-node", "train.sft", "--num-machines", "2", "--machine-rank", "3"], ERROR, "--machine-rank"),
        (["run-node", "acquire.digits", "--pipeline", "missing.yaml"], ERROR, "missing.yaml: pipeline file not found"),
        (["run-node", "acquire.digits", "--workspace", "a-file"], ERROR, "the workspace is a file"),
    ],
    "dvc sync": [
        (["dvc", "sync", "missing.yaml"], ERROR, "missing.yaml: pipeline file not found"),
        (["dvc", "sync", "--check", "--force"], ERROR, "--force: --check only compares the files"),
        (["dvc", "sync", "--root", "a-file"], ERROR, "--root: a-file is not a folder"),
        (["dvc", "sync", "--root", "nowhere"], ERROR, "--root: nowhere is not a folder"),
        (["dvc", "sync", "--set", "stages.sft.trainer=sftt"], ERROR, "stages.sft.trainer"),
    ],
    "dvc code": [
        (["dvc", "code"], USAGE, "Missing argument 'out'"),
        (["dvc", "code", "a-file"], ERROR, "OUT: a-file is a file; give a folder, e.g. workspace/code"),
        (["dvc", "code", "a-file/code"], ERROR, "OUT: "),
    ],
    "check-consistency": [
        (["check-consistency", "missing.yaml"], ERROR, "missing.yaml: pipeline file not found"),
        (["check-consistency", "--stage", "nope"], ERROR, "unknown node 'train.nope'"),
        (["check-consistency", "--stage", "grpo"], ERROR, "pass `--set smoke=true` here too"),
        (["check-consistency", "--workspace", "a-file"], ERROR, "the workspace is a file"),
    ],
    "validate": [
        (["validate"], USAGE, "Missing argument 'pipeline'"),
        (["validate", "missing.yaml"], ERROR, "missing.yaml: pipeline file not found"),
        (["validate", "empty"], ERROR, "empty: this is a folder"),
        (["validate", DIGITS, "--set", "stages.sft.train.lr=.inf"], ERROR, "stages.sft.train.lr: inf is not a finite"),
        (["validate", DIGITS, "--set", "stages.grpo.train.group_size=one"], ERROR, "stages.grpo.train.group_size"),
        (
            ["validate", DIGITS, "--set", "stages.grpo.train.replay_memory_gib=2"],
            ERROR,
            "stages.grpo.train: replay_memory_gib sizes replay_steps_per_pass: auto, which is not set",
        ),
    ],
    "config show": [
        (["config", "show", "missing.yaml"], ERROR, "missing.yaml: pipeline file not found"),
        (["config", "show", "--set", "seed"], ERROR, "--set: override 'seed'"),
        (["config", "show", "--set", "stages.sftt.seed=1"], ERROR, "stages.sftt"),
    ],
    "sample": [
        (["sample"], USAGE, "Missing argument 'export'"),
        (["sample", "empty"], USAGE, "'--prompt'"),
        (["sample", "nowhere", "--prompt", "a digit"], ERROR, "sample: nowhere does not exist"),
        (["sample", "a-file", "--prompt", "a digit"], ERROR, "sample: a-file is a file"),
        (["sample", "empty", "--prompt", "a digit", "-n", "zero"], USAGE, "'-n'"),
        (["sample", "empty", "--prompt", "a digit", "--steps", "0"], USAGE, "'--steps'"),
        (["sample", "empty", "--prompt", "a digit", "--out", "empty"], ERROR, "--out: empty is a folder"),
        (["sample", "empty", "--prompt", "a digit", "--out", "a-file/g.png"], ERROR, "--out: "),
    ],
    "list": [
        (["list"], USAGE, "Missing argument 'what'"),
        (
            ["list", "samplers"],
            ERROR,
            "unknown registry 'samplers'; use trainers, models, rewards, metrics, datasets or encoders",
        ),
    ],
    "reward-server": [
        (["reward-server"], USAGE, "Missing argument 'name'"),
        (["reward-server", "nope"], ERROR, "unknown reward 'nope'"),
        (["reward-server", "jpeg_compressibility", "--port", "70000"], USAGE, "'--port'"),
        (["reward-server", "jpeg_compressibility", "--max-batch", "0"], USAGE, "'--max-batch'"),
        (["reward-server", "jpeg_compressibility", "--option", "quality"], ERROR, "--option 'quality' must be"),
        (["reward-server", "jpeg_compressibility", "--option", "quality=9"], ERROR, "bad options for reward"),
        (["reward-server", "jpeg_compressibility", "--host", "0.0.0.0"], ERROR, "--token-env"),
        (["reward-server", "jpeg_compressibility", "--token-env", UNSET], ERROR, f"{UNSET} (--token-env) is not set"),
    ],
}


def _leaf_commands() -> set[str]:
    """The name of every command ``flowpost`` lists, groups spelled out (``dvc sync``); hidden deprecated
    aliases are in ``ALIASES``."""
    names: set[str] = set()

    def walk(group: object, prefix: str) -> None:
        for name, command in group.commands.items():  # type: ignore[attr-defined]
            if command.hidden:
                continue
            if hasattr(command, "commands"):
                walk(command, f"{prefix}{name} ")
            else:
                names.add(f"{prefix}{name}")

    walk(get_command(app), "")
    return names


# deprecated spelling -> (current spelling, the one warning line it prints first)
ALIASES: dict[tuple[str, ...], tuple[tuple[str, ...], str]] = {
    ("stage", "train.nope"): (("run-node", "train.nope"), "warning: `flowpost stage` is now `flowpost run-node`"),
    ("run-node", "report", "--layout", "fixed"): (
        ("run-node", "report", "--folders", "fixed"),
        "warning: `--layout` is now `--folders`",
    ),
}


def _tree(root: Path) -> dict[str, int]:
    """Every path under ``root`` with its size (folders: 0)."""
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else 0) for p in root.rglob("*")}


def test_every_command_is_in_the_matrix() -> None:
    assert _leaf_commands() == set(CASES)


@pytest.mark.parametrize(
    ("old", "new", "warning"), [(old, *new) for old, new in ALIASES.items()], ids=map(" ".join, ALIASES)
)
def test_a_deprecated_spelling_warns_on_one_line_then_does_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: tuple[str, ...], new: tuple[str, ...], warning: str
) -> None:
    monkeypatch.chdir(tmp_path)
    current, deprecated = flowpost_main(*new), flowpost_main(*old)
    assert (deprecated.code, deprecated.stdout) == (current.code, current.stdout) == (ERROR, "")
    assert deprecated.stderr == f"{warning}\n{current.stderr}" and "warning" not in current.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [case for cases in CASES.values() for case in cases],
    ids=[" ".join(case[0]) or "-" for cases in CASES.values() for case in cases],
)
def test_a_bad_argument_exits_with_one_message_naming_it_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], code: int, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(UNSET, raising=False)
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "empty").mkdir()
    before = _tree(tmp_path)
    outcome = flowpost_main(*args)
    assert outcome.code == code, outcome
    assert message in outcome.stderr, outcome.stderr
    assert "Traceback" not in outcome.stderr + outcome.stdout
    if code == ERROR:
        assert outcome.stderr.startswith("error: ") and outcome.stderr.count("error:") == 1, outcome.stderr
    else:
        assert outcome.stderr.startswith("Usage: flowpost") and outcome.stderr.count("Error") == 1, outcome.stderr
    assert _tree(tmp_path) == before
