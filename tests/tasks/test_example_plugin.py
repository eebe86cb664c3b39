"""The example plugin (``examples/flowpost-example-plugin``) installed: ``flowpost list`` marks its reward and
metric, its pipelines validate, an evaluation scores with both, and (slow) its pipeline trains a short GRPO
stage on its reward and scores it with its metric."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_main import flowpost_main
from plugin_site import EXAMPLE, install_example_plugin, on_path

from flowpost.core.config.loading import load_pipeline, validate_pipeline
from flowpost.core.config.schema import MetricConfig, RewardConfig
from flowpost.core.events import read_events
from flowpost.core.io import read_json
from flowpost.tasks.conditions import encoder_fingerprint
from flowpost.tasks.evaluate import evaluate_stage
from flowpost.tasks.runner import PipelineRun

PIPELINES = EXAMPLE / "pipelines"
PLUGIN = "plugin: flowpost-example-plugin"
SHORT = [  # a GRPO stage from scratch: two iterations of 8 rollouts, 3 sampling steps; 20 evaluation samples
    "smoke=true",
    "stages.grpo.model.init=scratch",
    "stages.grpo.train.prompts_per_iteration=2",
    "stages.grpo.train.group_size=4",
    "stages.grpo.train.rollout_batch_size=8",
    "stages.grpo.train.train_batch_size=8",
    "stages.grpo.sampling.steps=3",
    "stages.grpo.sampling.window=2",
    "evaluate.after=[grpo]",
    "evaluate.samples=20",
    "evaluate.steps=2",
]


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    with on_path(install_example_plugin(tmp_path / "site"), monkeypatch) as installed:
        yield installed


def test_flowpost_list_marks_the_plugin_entries(site: Path) -> None:
    rewards = flowpost_main("list", "rewards").stdout.splitlines()
    metrics = flowpost_main("list", "metrics").stdout.splitlines()
    assert f"contrast\tflowpost_example_plugin.rewards:Contrast\t{PLUGIN}" in rewards
    assert "jpeg_compressibility\tflowpost.core.rewards.jpeg:JpegCompressibility" in rewards  # a built-in: unmarked
    assert "digit_adherence\tflowpost_digits.reward:DigitAdherence\tplugin: flowpost" in rewards  # the digits extra
    assert f"sharpness\tflowpost_example_plugin.metrics:Sharpness\t{PLUGIN}" in metrics
    assert f"contrast\tflowpost_example_plugin.rewards:Contrast\t{PLUGIN}" in metrics  # every reward is a metric
    datasets = flowpost_main("list", "datasets").stdout.splitlines()
    assert "image-folder\tflowpost.tasks.acquire:ImageFolderSource" in datasets
    assert "builtin-digits\tflowpost_digits.source:DigitsSource\tplugin: flowpost" in datasets
    assert flowpost_main("list", "encoders").stdout.splitlines() == [
        "minilm\tflowpost_digits.encoder:MiniLMEncoder\tplugin: flowpost"
    ]


@pytest.mark.parametrize("pipeline", ["entry-points.yaml", "class-paths.yaml"])
def test_flowpost_validate_accepts_the_example_pipelines(site: Path, pipeline: str) -> None:
    outcome = flowpost_main("validate", str(PIPELINES / pipeline))
    assert outcome.code == 0, outcome.stderr
    assert "valid pipeline" in outcome.stdout


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ("entry-points.yaml", "stages.grpo.rewards.0.name: unknown reward 'contrast'"),
        (
            "class-paths.yaml",
            "stages.grpo.rewards.0.name: reward 'flowpost_example_plugin.rewards:Contrast': importing",
        ),
    ],
)
def test_without_the_plugin_validate_names_the_reward_it_cannot_load(pipeline: str, message: str) -> None:
    outcome = flowpost_main("validate", str(PIPELINES / pipeline))
    assert outcome.code == 1 and message in outcome.stderr, outcome.stderr


def test_an_evaluation_scores_with_the_plugin_metric_and_reward_by_entry_point_or_class_path(
    site: Path, completed_workspace: tuple[Path, dict[str, str]], tiny_pipeline, tmp_path: Path
) -> None:
    run = PipelineRun(validate_pipeline(tiny_pipeline()), completed_workspace[0])
    named = {  # key -> name: an entry point, and class paths of a metric and of a reward
        "sharpness": "sharpness",
        "path": "flowpost_example_plugin.metrics:Sharpness",
        "contrast": "flowpost_example_plugin.rewards:Contrast",
    }
    metrics = [MetricConfig(name=name, key=key) for key, name in named.items()]
    conditions = run.path("conditions.minilm")
    result = evaluate_stage(
        run.pipeline.evaluate.model_copy(update={"metrics": metrics}),
        stage="sft",
        rewards=[RewardConfig(name="contrast", options={"target": 0.0})],
        train_dir=run.path("train.sft"),
        dataset_dir=run.path("acquire.digits"),
        conditions_dir=conditions,
        encoder_fingerprint=encoder_fingerprint(conditions),
        out_dir=tmp_path / "eval",
        seed=0,
        smoke=True,
    )
    assert result["sharpness"] > 0 and result["path"] == result["sharpness"]  # one class, two ways to name it
    assert 0 < result["contrast"] <= 0.5  # RMS contrast
    assert result["trained_reward"] == pytest.approx(-result["contrast"], rel=1e-5)  # minus its distance to target 0


@pytest.mark.slow
def test_the_example_pipeline_trains_on_the_plugin_reward_and_scores_with_its_metric(
    site: Path, tmp_path: Path
) -> None:
    run = PipelineRun(load_pipeline(PIPELINES / "entry-points.yaml", SHORT), tmp_path / "ws")
    for node in ("acquire.digits", "conditions.minilm", "train.grpo", "eval.grpo"):
        assert run.execute(node).status == "ran", node
    events = read_events(run.path("train.grpo") / "events.jsonl")
    steps = [event["metrics"] for event in events if event["event"] == "progress"]
    assert len(steps) == 2
    assert all(-0.35 <= step["reward/contrast_mean"] <= 0 for step in steps)  # options.target reached the reward
    metrics = read_json(run.path("eval.grpo") / "metrics.json")
    assert math.isfinite(metrics["sharpness"]) and metrics["sharpness"] > 0
    assert 0 < metrics["contrast"] <= 0.5
