from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flowpost.core.config.loading import (
    apply_overrides,
    default_pipeline_path,
    load_pipeline,
    parse_override,
    pipeline_to_dict,
    validate_pipeline,
)
from flowpost.core.config.schema import PipelineConfig
from flowpost.core.trainers.offline.sft import SFTArguments
from flowpost.core.trainers.rl.grpo import GRPOArguments
from flowpost.errors import FlowpostError

REPO = Path(__file__).resolve().parents[3]
DIGITS = REPO / "flowpost" / "pipelines" / "digits.yaml"


def _error(overrides: list[str], path: str | Path | None = None) -> str:
    with pytest.raises(FlowpostError) as info:
        load_pipeline(path, overrides)
    return str(info.value)


# -- the embedded default -------------------------------------------------------------------------


def test_default_pipeline_validates() -> None:
    pipeline = load_pipeline(None)
    assert isinstance(pipeline, PipelineConfig)
    assert list(pipeline.stages) == ["sft", "grpo"]
    assert pipeline.stages["sft"].trainer == "sft"
    assert isinstance(pipeline.stages["sft"].arguments(), SFTArguments)
    grpo = pipeline.stages["grpo"]
    assert isinstance(grpo.arguments(), GRPOArguments)
    assert grpo.model.init == "sft" and [r.name for r in grpo.rewards] == ["digit_adherence"]
    assert grpo.sampling.guidance == 1.0 and pipeline.evaluate.guidance == 1.0
    assert pipeline.evaluate.after == ["sft", "grpo"]
    assert default_pipeline_path().resolve() == DIGITS.resolve()


def test_default_pipeline_fills_evaluate_references() -> None:
    pipeline = load_pipeline(None)
    assert pipeline.evaluate.dataset in pipeline.datasets
    assert pipeline.evaluate.conditions in pipeline.conditions
    assert pipeline.export is not None and pipeline.export.from_stage == "grpo"
    # by_alias: the dumped form uses the YAML spelling and validates again
    dumped = pipeline_to_dict(pipeline)
    assert dumped["export"]["from"] == "grpo"
    assert validate_pipeline(dumped) == pipeline


# -- overrides ------------------------------------------------------------------------------------


def test_overrides_apply_and_parse_values() -> None:
    pipeline = load_pipeline(
        None,
        [
            "stages.sft.train.lr=1e-4",
            "stages.sft.train.batch_size=8",
            "smoke=true",
            "seed=5",
            "stages.sft.callbacks.trackers=[tensorboard]",
        ],
    )
    args = pipeline.stages["sft"].arguments()
    assert args.lr == pytest.approx(1e-4)
    assert isinstance(args.lr, float)
    assert args.batch_size == 8
    assert pipeline.smoke is True
    assert pipeline.seed == 5
    assert pipeline.stages["sft"].callbacks.trackers == ["tensorboard"]


def test_parse_override_types() -> None:
    assert parse_override("a=0.5") == ("a", 0.5)
    assert parse_override("a=false") == ("a", False)
    assert parse_override("a=12") == ("a", 12)
    assert parse_override("a=text") == ("a", "text")
    assert parse_override("a=") == ("a", "")
    assert parse_override("a=no") == ("a", "no")  # YAML 1.2: only true/false are booleans
    assert parse_override("a=on") == ("a", "on")


def test_a_pipeline_rewritten_by_a_yaml_1_2_writer_still_validates(tmp_path: Path) -> None:
    # `dvc exp run -S` rewrites params.yaml without quoting "no"
    text = DIGITS.read_text() + "\n"
    path = tmp_path / "p.yaml"
    path.write_text(text.replace("launch: {num_processes: 1, backend: ddp}", "launch: {mixed_precision: no}", 1))
    assert load_pipeline(path).stages["sft"].launch.mixed_precision == "no"


def test_exponent_number_override_is_a_number() -> None:
    # `--set stages.sft.train.lr=1e-4` is the documented example; PyYAML's YAML 1.1 resolver
    # reads "1e-4" as a string, which then survives into the resolved config (and its hash).
    key, value = parse_override("stages.sft.train.lr=1e-4")
    assert key == "stages.sft.train.lr"
    assert isinstance(value, float) and value == pytest.approx(1e-4)
    resolved = pipeline_to_dict(load_pipeline(None, ["stages.sft.train.lr=1e-4"]))
    assert resolved["stages"]["sft"]["train"]["lr"] == pytest.approx(1e-4)


def test_apply_overrides_does_not_mutate_input() -> None:
    data = {"stages": {"sft": {"train": {"lr": 1.0}}}}
    result = apply_overrides(data, ["stages.sft.train.lr=2", "stages.new.x=3"])
    assert data == {"stages": {"sft": {"train": {"lr": 1.0}}}}
    assert result["stages"]["sft"]["train"]["lr"] == 2
    assert result["stages"]["new"] == {"x": 3}


@pytest.mark.parametrize("override", ["novalue", "=3", "a..b=1", ".a=1", "a.=1"])
def test_malformed_override_is_rejected(override: str) -> None:
    message = _error([override])
    assert override in message


def test_override_through_non_mapping_is_rejected() -> None:
    message = _error(["name.x=1"])
    assert "name" in message and "not a mapping" in message


# -- unknown keys and wrong types -----------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "colour",
        "stages.sft.model.foo",
        "stages.sft.train.lrr",
        "stages.sft.callbacks.ema.decayy",
        "datasets.digits.size",
        "evaluate.sample",
        "export.format",
    ],
)
def test_unknown_key_names_full_dotted_path(key: str) -> None:
    message = _error([f"{key}=1"])
    assert f"{key}:" in message
    assert "unknown key" in message
    assert str(DIGITS.name) in message


def test_wrong_type_names_dotted_path() -> None:
    message = _error(["stages.sft.train.batch_size=abc"])
    assert "stages.sft.train.batch_size:" in message


def test_out_of_range_value_names_dotted_path() -> None:
    message = _error(["stages.sft.callbacks.ema.decay=1.5"])
    assert "stages.sft.callbacks.ema.decay:" in message


# -- references -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "path", "allowed"),
    [
        ("stages.sft.data.dataset=nope", "stages.sft.data.dataset", ["digits"]),
        ("stages.sft.data.conditions=nope", "stages.sft.data.conditions", ["minilm"]),
        ("export.from=nope", "export.from", ["sft"]),
        ("stages.sft.model.init=nope", "stages.sft.model.init", ["scratch"]),
        ("evaluate.after=[nope]", "evaluate.after.0", ["sft"]),
        ("conditions.minilm.datasets=[nope]", "conditions.minilm.datasets.0", ["digits"]),
    ],
)
def test_bad_reference_names_path_and_allowed_values(override: str, path: str, allowed: list[str]) -> None:
    message = _error([override])
    assert f"{path}:" in message
    assert "'nope'" in message
    assert "allowed:" in message
    allowed_text = message.split("allowed:", 1)[1].splitlines()[0]
    for value in allowed:
        assert value in allowed_text


def test_stage_init_may_name_only_earlier_stage(tmp_path: Path) -> None:
    data = yaml.safe_load(DIGITS.read_text())
    sft = data["stages"]["sft"]
    data["stages"] = {"first": {**sft, "model": {"init": "second"}}, "second": sft}
    data["evaluate"]["after"] = ["first"]
    data["export"]["from"] = "second"
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(data)
    assert "stages.first.model.init:" in str(info.value)
    data["stages"] = {"first": sft, "second": {**sft, "model": {"init": "first"}}}
    pipeline = validate_pipeline(data)
    assert pipeline.stages["second"].model.init == "first"


# -- trainers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("stages.sft.launch.num_processes=3", "stages.sft.train.batch_size"),
        ("stages.grpo.launch.num_processes=3", "stages.grpo.train.rollout_batch_size"),
        ("stages.sft.model.family=nope", "stages.sft.model.family"),
        ("evaluate.samples=1", "evaluate.samples"),
        ("datasets.digits.image_size=10", "datasets.digits.image_size"),
        ("stages.sft.model.init_weights=best", "stages.sft.model.init_weights"),
        ("stages.sft.data=null", "stages.sft.data"),
    ],
)
def test_settings_that_would_fail_later_are_rejected_up_front(override: str, path: str) -> None:
    assert path in _error([override])


def test_zero2_without_deepspeed_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowpost.core.config.schema import stages

    overrides = ["stages.sft.launch.backend=deepspeed-zero2", "stages.sft.launch.num_processes=2"]
    assert load_pipeline(None, overrides).stages["sft"].launch.backend == "deepspeed-zero2"
    monkeypatch.setattr(stages, "deepspeed_installed", lambda: False)
    message = _error(overrides)
    assert "stages.sft.launch" in message and "pip install" in message and "flowpost[deepspeed]" in message


def test_bf16_is_accepted_and_fp16_says_to_use_bf16() -> None:
    assert (
        load_pipeline(None, ["stages.sft.launch.mixed_precision=bf16"]).stages["sft"].launch.mixed_precision == "bf16"
    )
    message = _error(["stages.sft.launch.mixed_precision=fp16"])
    assert "stages.sft.launch" in message and "mixed_precision: bf16" in message


def test_two_processes_split_the_default_batches() -> None:
    pipeline = load_pipeline(None, ["stages.sft.launch.num_processes=2", "stages.grpo.launch.num_processes=2"])
    assert pipeline.stages["grpo"].launch.num_processes == 2


def test_stage_names_must_be_plain_identifiers(tmp_path: Path) -> None:
    config = yaml.safe_load(default_pipeline_path().read_text())
    config["stages"]["../evil"] = config["stages"].pop("sft")
    config["evaluate"]["after"] = []
    config.pop("export")
    with pytest.raises(FlowpostError, match=r"stages\.\.\./evil"):
        validate_pipeline(config, source="x.yaml")


def test_a_grpo_stage_needs_a_known_reward() -> None:
    rl = "stages.rl.{}"
    base = [
        rl.format("trainer=grpo"),
        rl.format("model.init=sft"),
        rl.format("data.dataset=digits"),
        rl.format("data.conditions=minilm"),
    ]
    assert "stages.rl.rewards: trainer 'grpo' needs at least one reward" in _error(base)
    assert "stages.rl.rewards.0.name" in _error([*base, "stages.rl.rewards=[{name: nope}]"])


def test_unknown_trainer_names_trainer_and_known_ones() -> None:
    message = _error(["stages.sft.trainer=grpoo"])
    assert "'grpoo'" in message
    from flowpost.core.trainers.registry import TRAINERS

    assert f"known trainers: {', '.join(sorted(TRAINERS))}" in message


@pytest.mark.parametrize(
    ("override", "path", "suggestion"),
    [
        ("stages.sft.trainer=grpoo", "stages.sft.trainer", "grpo"),
        ("stages.grpo.rewards=[{name: digit_adherance}]", "stages.grpo.rewards.0.name", "digit_adherence"),
        ("stages.sft.model.family=tiny_sd3", "stages.sft.model.family", "tiny-sd3"),
    ],
)
def test_a_misspelt_registry_name_gets_the_closest_known_one(override: str, path: str, suggestion: str) -> None:
    message = _error([override])
    assert path in message and f"did you mean {suggestion!r}?" in message


def test_a_trainer_without_feedback_given_rewards_is_rejected() -> None:
    message = _error(["stages.sft.rewards=[{name: digit_adherence}]"])
    assert "stages.sft.rewards: trainer 'sft' uses no reward; remove the section" in message


def test_unknown_trainer_names_the_stage_path() -> None:
    # every user error names its dotted config path; with several stages, "trainer" alone
    # does not say which stage is wrong
    message = _error(["stages.sft.trainer=grpoo"])
    assert "stages.sft.trainer" in message


def test_uppercase_trainer_is_rejected() -> None:
    message = _error(["stages.sft.trainer=SFT"])
    assert "stages.sft.trainer:" in message
    assert "lowercase" in message


# -- files ----------------------------------------------------------------------------------------


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: digits\nseed: 0\nstages:\n  sft: {trainer: sft\n  other: [1, 2\n")
    message = _error([], path)
    assert "invalid YAML" in message
    line = message.split(f"{path}:", 1)[1].split(":", 1)[0]
    assert line.isdigit() and int(line) >= 4


def test_yaml_error_line_is_the_offending_line(tmp_path: Path) -> None:
    path = tmp_path / "tabs.yaml"
    path.write_text("name: digits\nseed: 0\nsmoke: false\nkey: value: other\n")
    message = _error([], path)
    assert f"{path}:4:" in message


def test_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    message = _error([], path)
    assert str(path) in message
    assert "not found" in message


def test_non_mapping_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    message = _error([], path)
    assert str(path) in message and "mapping" in message


# -- the CLI --------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowpost.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_cli_validate_default_pipeline_exits_zero() -> None:
    result = _cli("validate", str(DIGITS))
    assert result.returncode == 0, result.stderr
    assert "digits" in result.stdout and "sft" in result.stdout


def test_cli_validate_broken_file_reports_path_without_traceback(tmp_path: Path) -> None:
    data = yaml.safe_load(DIGITS.read_text())
    data["stages"]["sft"]["train"]["lrr"] = 1.0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = _cli("validate", str(path))
    assert result.returncode != 0
    assert "stages.sft.train.lrr" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_cli_validate_yaml_error_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "syntax.yaml"
    path.write_text("name: digits\nstages: [\n")
    result = _cli("validate", str(path))
    assert result.returncode != 0
    assert str(path) in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    "example", sorted((Path(__file__).parents[3] / "examples").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_example_pipeline_validates(example: Path) -> None:
    pipeline = load_pipeline(example)
    assert pipeline.stages


@pytest.mark.parametrize("trainer", ["grpo", "grpo-guard", "dppo"])
@pytest.mark.parametrize(
    "sampling",
    [
        "{dynamics: ode, steps: 10}",
        "{dynamics: flow-sde, steps: 10, noise_level: 0}",
        "{dynamics: dance-sde, steps: 10, noise_level: 0}",
        "{dynamics: cps, steps: 10, noise_level: 0}",
        "{dynamics: cps, steps: 10, noise_level: 2}",  # sin(pi) = 0 up to rounding
    ],
)
def test_a_coupled_trainer_without_transition_noise_is_rejected_naming_the_sampling_section(
    trainer: str, sampling: str
) -> None:
    overrides = [
        f"stages.grpo.trainer={trainer}",
        "stages.grpo.train={iterations: 1}",
        f"stages.grpo.sampling={sampling}",
    ]
    message = _error(overrides)
    assert "stages.grpo.sampling:" in message and "zero transition std" in message


def test_a_decoupled_trainer_may_sample_with_the_ode() -> None:
    pipeline = load_pipeline(REPO / "examples" / "digits-nft.yaml")
    assert pipeline.stages["nft"].sampling.dynamics == "ode"
