"""Plugins: trainers, model families, rewards and metrics from installed packages' entry points or written as
``package.module:Class``, checked like the built-ins, with errors naming the config path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_main import flowpost_main
from plugin_site import on_path, write_distribution

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.datasets import DATASET_REGISTRY
from flowpost.core.evaluation.registry import METRIC_REGISTRY, build_metric
from flowpost.core.evaluation.reward_metric import RewardMetric
from flowpost.core.models.registry import FAMILY_REGISTRY, adapter_class
from flowpost.core.models.text_encoders import ENCODER_REGISTRY
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.registries import registry
from flowpost.core.rewards.registry import REWARD_REGISTRY, build_reward
from flowpost.core.trainers.offline.sft import SFTArguments
from flowpost.core.trainers.registry import TRAINER_REGISTRY, arguments_class, trainer_class
from flowpost.errors import FlowpostError

MODULES = {
    "trainers.py": '''
from flowpost.core.trainers.dataset import DatasetTrainer
from flowpost.core.trainers.offline.sft import SFTTrainer


class PlainSFT(SFTTrainer):
    """SFT under a plugin's name."""


class Unfinished(DatasetTrainer):
    """A trainer whose hooks are missing."""
''',
    "models.py": '''
from flowpost.core.models.tiny_sd3 import TinySD3Adapter


class OtherTiny(TinySD3Adapter):
    """The tiny family under a plugin's name."""

    family = "other-tiny"
''',
    "scores.py": '''
import torch


class Darkness:
    """One minus the mean pixel."""

    name = "darkness"

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def __call__(self, media, prompts, metadata):
        return self.scale * (1 - media.flatten(1).mean(1))


class Spread:
    """The standard deviation of all pixels of the samples."""

    name = "spread"

    def __call__(self, samples):
        return float(samples.images.std())


class Nameless:
    """A reward without the name every reward has."""

    def __call__(self, media, prompts, metadata):
        return media.flatten(1).mean(1)


def darkness(media, prompts, metadata):
    return 1 - media.flatten(1).mean(1)
''',
}
POINTS = {
    "flowpost.trainers": {"plain-sft": "my_algos.trainers:PlainSFT", "not-a-trainer": "my_algos.scores:Darkness"},
    "flowpost.models": {"other-tiny": "my_algos.models:OtherTiny"},
    "flowpost.rewards": {"darkness": "my_algos.scores:Darkness"},
    "flowpost.metrics": {"spread": "my_algos.scores:Spread"},
}
GRPO = {
    "trainer": "grpo",
    "model": {"family": "tiny-sd3", "init": "sft"},
    "data": {"dataset": "digits", "conditions": "minilm"},
    "rewards": [{"name": "darkness"}],
    "sampling": {"steps": 3},
    "train": {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 8},
}


def _install(site: Path, points: dict[str, dict[str, str]]) -> Path:
    package = site / "my_algos"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""Algorithms for flowpost."""\n')
    for name, source in MODULES.items():
        (package / name).write_text(source.lstrip())
    write_distribution(site, "my-algos", points)
    return site


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    with on_path(_install(tmp_path / "site", POINTS), monkeypatch) as installed:
        yield installed


@pytest.fixture
def pipeline(tiny_pipeline) -> Callable[..., dict[str, Any]]:
    """The tiny pipeline with a GRPO stage after its SFT stage, rewarded by the plugin's ``darkness``."""

    def make() -> dict[str, Any]:
        config = tiny_pipeline()
        config["stages"]["grpo"] = {**GRPO, "rewards": [{"name": "darkness"}]}
        return config

    return make


@pytest.mark.parametrize(
    "registered",
    [TRAINER_REGISTRY, FAMILY_REGISTRY, REWARD_REGISTRY, METRIC_REGISTRY, DATASET_REGISTRY],
    ids=lambda r: r.plural,
)
def test_every_built_in_passes_the_check_a_plugin_gets(registered) -> None:
    classes = [registered.load(name, where="test") for name in registered.builtins]
    assert all(registered.mismatch(cls) is None for cls in classes)


def test_the_digits_entry_points_of_flowpost_pass_the_check_a_plugin_gets() -> None:
    found = {}
    for registered in (DATASET_REGISTRY, ENCODER_REGISTRY, REWARD_REGISTRY, METRIC_REGISTRY):
        for entry in registered.entries(where="test").values():
            if entry.plugin == "flowpost":
                assert entry.extras == ("digits",) and registered.problem(entry.name, where="test") is None
                found[entry.name] = entry.target.partition(":")[0]
    assert found == {
        "builtin-digits": "flowpost_digits.source",
        "minilm": "flowpost_digits.encoder",
        "digit_adherence": "flowpost_digits.reward",
        "adherence": "flowpost_digits.judge",
        "fd": "flowpost_digits.judge",
    }


def test_an_entry_point_whose_extra_is_missing_says_which_to_install(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    (site / "fancy_scores").mkdir(parents=True)
    (site / "fancy_scores" / "__init__.py").write_text("import fancy_library_not_installed\n")
    points = {"sharp": "fancy_scores:Sharp [fancy]", "plain": "fancy_scores:Sharp"}
    write_distribution(site, "fancy-scores", {"flowpost.metrics": points})
    with on_path(site, monkeypatch):
        with pytest.raises(FlowpostError) as info:
            build_metric("sharp", options={}, where="evaluate.metrics.0", assets_dir=None)
        assert str(info.value) == (
            "evaluate.metrics.0: metric 'sharp' comes with the fancy extra of fancy-scores, which is not installed "
            "(No module named 'fancy_library_not_installed'); pip install 'fancy-scores[fancy]'"
        )
        with pytest.raises(FlowpostError, match="importing 'fancy_scores' failed .ModuleNotFoundError"):
            build_metric("plain", options={}, where="evaluate.metrics.0", assets_dir=None)  # no extra named


def test_entry_points_register_a_trainer_a_family_a_reward_and_a_metric(site: Path, pipeline) -> None:
    config = pipeline()
    config["stages"]["sft"]["trainer"] = "plain-sft"
    config["stages"]["sft"]["model"]["family"] = "other-tiny"
    config["evaluate"]["metrics"] = ["adherence", "spread", "darkness"]
    validated = validate_pipeline(config)
    assert validated.stages["sft"].trainer == "plain-sft"
    assert trainer_class("plain-sft").__name__ == "PlainSFT" and arguments_class("plain-sft") is SFTArguments
    assert issubclass(adapter_class("other-tiny"), TinySD3Adapter)
    assert registry("trainers")["plain-sft"].plugin == "my-algos" and registry("trainers")["sft"].plugin is None
    assert {"darkness", "spread", "adherence"} <= set(registry("metrics"))


def test_a_trainer_and_a_family_written_as_class_paths_keep_their_case(site: Path, pipeline) -> None:
    config = pipeline()
    config["stages"]["sft"]["trainer"] = "my_algos.trainers:PlainSFT"
    validated = validate_pipeline(config)
    assert validated.stages["sft"].trainer == "my_algos.trainers:PlainSFT"
    config["stages"]["sft"]["trainer"] = "SFT"  # a registered name is still lowercase
    with pytest.raises(FlowpostError, match="trainer names are lowercase; use 'sft'"):
        validate_pipeline(config)


def test_a_reward_and_a_metric_written_as_class_paths_are_built_like_registered_ones(site: Path) -> None:
    import torch

    from flowpost.core.evaluation.samples import EvalSamples

    images = torch.rand(4, 1, 8, 8)
    samples = EvalSamples(images, ["a"] * 4, [{}] * 4)
    by_path = build_reward("my_algos.scores:Darkness", options={"scale": 2.0}, where="stages.grpo.rewards.0")
    by_name = build_reward("darkness", options={"scale": 2.0}, where="stages.grpo.rewards.0")
    assert torch.equal(by_path(images, [], []), by_name(images, [], []))
    assert torch.allclose(by_path(images, [], []), 2 * (1 - images.flatten(1).mean(1)))
    as_metric = build_metric("my_algos.scores:Darkness", options={}, where="evaluate.metrics.0", assets_dir=None)
    assert isinstance(as_metric, RewardMetric)  # a reward scores as the mean of its scores
    assert as_metric(samples) == pytest.approx(float(1 - images.mean()), rel=1e-5)
    metric = build_metric("my_algos.scores:Spread", options={}, where="evaluate.metrics.1", assets_dir=None)
    assert metric(samples) == pytest.approx(float(images.std()))


def _set(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        config = config[int(key)] if isinstance(config, list) else config[key]
    config[last] = value


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "stages.sft.trainer",
            "not-a-trainer",
            "stages.sft.trainer: trainer 'not-a-trainer' (my_algos.scores:Darkness) is not a subclass of "
            "flowpost.core.trainers.base.BaseTrainer",
        ),
        ("stages.sft.trainer", "my_algos.trainers:unfinished", "has no attribute 'unfinished' (did you mean"),
        (
            "stages.sft.model.family",
            "my_algos.scores:Spread",
            "stages.sft.model.family: model family 'my_algos.scores:Spread' is not a subclass of "
            "flowpost.core.models.base.ModelAdapter",
        ),
        (
            "stages.grpo.rewards.0.name",
            "my_algos.scores:Spread",
            "stages.grpo.rewards.0.name: reward 'my_algos.scores:Spread' has __call__(self, samples), which cannot "
            "be called as __call__(self, media, prompts, metadata)",
        ),
        ("stages.grpo.rewards.0.name", "my_algos.scores:darkness", "is a function, not a class"),
        ("stages.grpo.rewards.0.name", "my_algos.score:Darkness", "importing 'my_algos.score' failed"),
        (
            "stages.grpo.rewards.0.name",
            "my_algos.scores:Darknes",
            "has no attribute 'Darknes' (did you mean 'Darkness'",
        ),
        ("stages.grpo.rewards.0.name", "my-algos:Darkness", "is not a package.module:Class path"),
        ("stages.grpo.rewards.0.name", "darknes", "unknown reward 'darknes' (did you mean 'darkness'?)"),
        ("evaluate.metrics", ["my_algos.scores:Spread"], "evaluate.metrics.0.key: metric 'my_algos.scores:Spread'"),
        ("evaluate.metrics", ["my_algos.scores:Sprea"], "evaluate.metrics.0: metric 'my_algos.scores:Sprea':"),
    ],
)
def test_validation_names_the_config_path_of_a_plugin_that_cannot_be_used(
    site: Path, pipeline, path: str, value: Any, message: str
) -> None:
    config = pipeline()
    _set(config, path, value)
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(config)
    assert message in str(info.value)


def test_an_abstract_plugin_trainer_is_refused_naming_its_missing_hooks(site: Path) -> None:
    with pytest.raises(FlowpostError, match="stages.sft.trainer: trainer 'my_algos.trainers:Unfinished' is abstract; "):
        trainer_class("my_algos.trainers:Unfinished", where="stages.sft.trainer")


def test_a_reward_without_a_name_is_refused_when_built(site: Path) -> None:
    with pytest.raises(FlowpostError, match=r"stages.grpo.rewards.0: reward 'my_algos.scores:Nameless' has no name"):
        build_reward("my_algos.scores:Nameless", options={}, where="stages.grpo.rewards.0")


def test_an_entry_point_reusing_a_built_in_name_is_an_error_naming_both(tmp_path: Path, monkeypatch, pipeline) -> None:
    points = {"flowpost.rewards": {"jpeg_compressibility": "my_algos.scores:Darkness"}}
    with on_path(_install(tmp_path / "site", points), monkeypatch):
        with pytest.raises(FlowpostError) as info:
            validate_pipeline(pipeline())
        listed = flowpost_main("list", "rewards")
    expected = (
        "package 'my-algos' declares reward 'jpeg_compressibility' (my_algos.scores:Darkness) in entry point group "
        "flowpost.rewards, and flowpost's built-in reward 'jpeg_compressibility' "
        "(flowpost.core.rewards.jpeg:JpegCompressibility) has that name; rename the entry point"
    )
    assert expected in str(info.value) and "stages.grpo.rewards.0.name" in str(info.value)
    assert listed.code == 1 and expected in listed.stderr and "flowpost list" in listed.stderr


def test_two_packages_declaring_one_name_is_an_error_naming_both(tmp_path: Path, monkeypatch) -> None:
    site = _install(tmp_path / "site", POINTS)
    write_distribution(site, "other-algos", {"flowpost.metrics": {"spread": "my_algos.scores:Darkness"}})
    with on_path(site, monkeypatch), pytest.raises(FlowpostError) as info:
        METRIC_REGISTRY.entries(where="evaluate.metrics.0")
    message = str(info.value)
    assert message.startswith("evaluate.metrics.0: package ") and "rename the entry point" in message
    assert "'my-algos'" in message and "'other-algos'" in message
