"""The promotion gate after export, and stages that start from the promoted export (``init: previous``)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from flowpost.core.config.loading import apply_overrides, validate_pipeline
from flowpost.core.config.schema import PromoteConfig
from flowpost.core.models.base import ADAPTER_FILE
from flowpost.errors import FlowpostError
from flowpost.tasks.dvc import dvc_stages
from flowpost.tasks.graph import build_nodes, fingerprints
from flowpost.tasks.plan import plan_run
from flowpost.tasks.promote import decide, promote_export, promoted_weights, read_promoted
from flowpost.tasks.runner import PipelineRun

GATE = {"metrics": {"adherence": "higher", "fd": "lower"}}
OTHER = "0" * 64  # the fingerprint of an export this workspace never built


def _gated(tiny_pipeline) -> dict[str, Any]:
    config = tiny_pipeline()
    config["export"]["promote"] = copy.deepcopy(GATE)
    return config


def _with_tune(tiny_pipeline) -> dict[str, Any]:
    """The gated pipeline plus stage ``tune``: the promoted export warm-started, ``sft`` while none is."""
    config = _gated(tiny_pipeline)
    tune = copy.deepcopy(config["stages"]["sft"])
    tune["model"] |= {"init": "previous", "fallback": "sft"}
    config["stages"]["tune"] = tune
    return config


def _run_all(run: PipelineRun) -> dict[str, str]:
    return {node_id: run.execute(node_id).status for node_id in run.nodes}


def _write_incumbent(workspace: Path, metrics: dict[str, float], export: str = "elsewhere") -> dict[str, Any]:
    record = {"export": export, "fingerprint": OTHER, "stage": "sft", "metrics": metrics}
    (workspace / "promoted.json").write_text(json.dumps(record))
    return record


def _decision(run: PipelineRun) -> dict[str, Any]:
    return json.loads((run.path("promote") / "promotion.json").read_text())


# -- the comparison ------------------------------------------------------------------------------


def test_nothing_promoted_yet_promotes() -> None:
    decision = decide(PromoteConfig.model_validate(GATE), {"adherence": 0.1, "fd": 50.0}, None)
    assert decision.promoted and decision.reason == "promoted: nothing was promoted before"


def test_a_regressed_metric_keeps_the_promoted_export_and_says_by_how_much() -> None:
    gate = PromoteConfig.model_validate(GATE)
    worse = decide(gate, {"adherence": 0.812, "fd": 9.0}, {"adherence": 0.9, "fd": 10.0})
    assert not worse.promoted
    assert worse.reason == "kept the promoted export: adherence 0.812 < 0.900 (promoted), worse by 0.088"
    both = decide(gate, {"adherence": 0.5, "fd": 12.5}, {"adherence": 0.9, "fd": 10.0})
    assert not both.promoted and "adherence 0.500 < 0.900" in both.reason and "fd 12.500 > 10.000" in both.reason


def test_equal_or_better_metrics_promote() -> None:
    gate = PromoteConfig.model_validate(GATE)
    held = {"adherence": 0.9, "fd": 10.0}
    assert decide(gate, dict(held), held).promoted
    better = decide(gate, {"adherence": 0.95, "fd": 8.0}, held)
    assert better.promoted and better.reason.startswith("promoted: no metric regressed (adherence 0.950")


def test_the_tolerance_allows_a_small_regression_only() -> None:
    gate = PromoteConfig.model_validate({**GATE, "tolerance": 0.05})
    held = {"adherence": 0.9, "fd": 10.0}
    assert decide(gate, {"adherence": 0.86, "fd": 10.04}, held).promoted
    beyond = decide(gate, {"adherence": 0.9, "fd": 10.2}, held)
    assert not beyond.promoted and "fd 10.200 > 10.000 (promoted), worse by 0.200, beyond the tolerance 0.05" in (
        beyond.reason
    )


def _fake_export(folder: Path, **metrics: float) -> Path:
    folder.mkdir(parents=True)
    (folder / "export.json").write_text(json.dumps({"metrics": {"reward_mean": 0.5, **metrics}}))
    (folder / ADAPTER_FILE).write_text("{}")
    (folder / "_complete.json").write_text("{}")
    return folder


def _promote(workspace: Path, export: Path, fingerprint: str, incumbent: dict[str, Any] | None) -> dict[str, Any]:
    """The gate as the fixed layout runs it: promoted exports are copied to ``promoted/``."""
    return promote_export(
        PromoteConfig.model_validate(GATE),
        stage="sft",
        export_dir=export,
        fingerprint=fingerprint,
        incumbent=incumbent,
        workspace=workspace,
        out_dir=workspace / "promotion",
        keep_dir=workspace / "promoted",
    )


def test_a_reused_export_folder_is_copied_before_it_is_recorded(tmp_path: Path) -> None:
    done = _promote(tmp_path, _fake_export(tmp_path / "a", adherence=0.5, fd=10.0), "a" * 64, None)
    record = read_promoted(tmp_path)
    assert done["promoted"] and record is not None and record["export"] == "promoted/aaaaaaaaaaaa"
    assert record["replaced"] is None and record["metrics"] == {"adherence": 0.5, "reward_mean": 0.5, "fd": 10.0}
    copied = promoted_weights(record, tmp_path)
    assert (copied / "export.json").is_file() and not (copied / "_complete.json").exists()

    second = _fake_export(tmp_path / "b", adherence=0.6, fd=9.0)
    _promote(tmp_path, second, "b" * 64, record)
    moved = read_promoted(tmp_path)
    assert moved is not None and moved["replaced"] == "a" * 64
    assert [path.name for path in (tmp_path / "promoted").iterdir()] == ["bbbbbbbbbbbb"]

    again = _promote(tmp_path, second, "b" * 64, moved)
    assert again == {"promoted": True, "reason": "already the promoted export"} and read_promoted(tmp_path) == moved

    worse = _promote(tmp_path, _fake_export(tmp_path / "c", adherence=0.1, fd=9.0), "c" * 64, moved)
    assert not worse["promoted"] and read_promoted(tmp_path) == moved
    decision = json.loads((tmp_path / "promotion" / "promotion.json").read_text())
    assert decision["incumbent"] == moved and decision["candidate"]["fingerprint"] == "c" * 64


def test_an_incomplete_promoted_record_is_an_error(tmp_path: Path) -> None:
    export = _fake_export(tmp_path / "a", adherence=0.5, fd=10.0)
    incumbent = _write_incumbent(tmp_path, {"adherence": 0.4})
    with pytest.raises(FlowpostError, match=r"no fd recorded to compare; delete it"):
        _promote(tmp_path, export, "a" * 64, incumbent)
    (tmp_path / "promoted.json").write_text(json.dumps({"export": "a"}))
    with pytest.raises(FlowpostError, match=r"promoted.json: the promoted record lacks fingerprint, stage, metrics"):
        read_promoted(tmp_path)


# -- configuration, graph, DVC -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "where", "says"),
    [
        ("evaluate.after=[]", "export.promote", "stage 'sft' is not evaluated; add it to evaluate.after"),
        ("export.promote.metrics.fid=lower", "export.promote.metrics", "unknown metric 'fid'"),
        ("export.promote.metrics={}", "export.promote.metrics", "at least 1 item"),
        ("export.promote.metrics.adherence=up", "export.promote.metrics.adherence", "'higher' or 'lower'"),
        ("export.promote.tolerance=-0.1", "export.promote.tolerance", "greater than or equal to 0"),
        ("stages.sft.model.fallback=sft", "stages.sft.model", "fallback applies only to init: previous"),
        ("stages.sft.model.init=latest", "stages.sft.model.init", "allowed: previous, scratch"),
        ("stages.tune.model.fallback=nope", "stages.tune.model.fallback", "unknown earlier stage 'nope'"),
        ("export=null", "stages.tune.model.init", "configure export.promote"),
        ("stages.previous.trainer=sft", "stages.previous", "reserved for model.init"),
    ],
)
def test_bad_promotion_settings_are_named(tiny_pipeline, override: str, where: str, says: str) -> None:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(apply_overrides(_with_tune(tiny_pipeline), [override]))
    assert f"{where}: " in str(info.value) and says in str(info.value)


def test_the_gate_runs_after_export_and_before_the_report(tiny_pipeline) -> None:
    nodes = {node.id: node for node in build_nodes(validate_pipeline(_with_tune(tiny_pipeline)))}
    assert nodes["promote"].deps == ("export",) and nodes["promote"].kind == "promote"
    assert nodes["report"].deps == ("eval.sft", "export", "promote", "train.sft")  # the last for its cost ledger
    assert "train.sft" in nodes["train.tune"].deps  # the fallback's: the graph does not depend on the record
    config = _gated(tiny_pipeline)
    config["stages"]["sft"]["model"]["init"] = "previous"  # falling back to scratch
    alone = {node.id: node for node in build_nodes(validate_pipeline(config))}
    assert alone["train.sft"].deps == ("acquire.digits", "conditions.minilm")


def test_the_gate_settings_change_only_the_gate_and_the_report(tiny_pipeline) -> None:
    config = _gated(tiny_pipeline)
    before = fingerprints(build_nodes(validate_pipeline(config)), code="code")
    config["export"]["promote"]["tolerance"] = 0.05
    after = fingerprints(build_nodes(validate_pipeline(config)), code="code")
    assert {node for node in before if before[node] != after[node]} == {"promote", "report"}


def test_the_gate_is_a_dvc_stage_that_reads_the_promoted_record(tiny_pipeline) -> None:
    stages = dvc_stages(validate_pipeline(_with_tune(tiny_pipeline)))["stages"]
    promote = stages["promote"]
    assert promote["deps"] == ["workspace/code/promote.json", "workspace/stages/sft/export"]
    assert promote["params"] == ["seed", "smoke", "export.promote"]
    assert promote["outs"] == ["workspace/stages/sft/promotion"] and promote["always_changed"] is True
    assert stages["report"]["deps"][-2:] == ["workspace/stages/sft/promotion", "workspace/stages/sft/final"]
    assert stages["export"]["params"] == ["seed", "smoke", "export.from", "export.formats", "evaluate.weights"]
    assert stages["train.tune"]["always_changed"] is True and "always_changed" not in stages["train.sft"]


# -- the real runner -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_pipeline) -> Path:
    """A workspace where the gated tiny pipeline ran once."""
    workspace = tmp_path_factory.mktemp("promotion")
    assert set(_run_all(PipelineRun(validate_pipeline(_gated(tiny_pipeline)), workspace)).values()) == {"ran"}
    return workspace


@pytest.fixture
def workspace(base: Path, tmp_path: Path) -> Path:
    """A copy of ``base`` a test may change."""
    return Path(shutil.copytree(base, tmp_path / "ws"))


def test_the_first_run_promotes_its_export(base: Path, tiny_pipeline) -> None:
    run = PipelineRun(validate_pipeline(_gated(tiny_pipeline)), base)
    record = read_promoted(base)
    assert record is not None and record["fingerprint"] == run.fingerprints["export"] and record["stage"] == "sft"
    assert run.workspace / record["export"] == run.path("export") and record["replaced"] is None
    exported = json.loads((run.path("export") / "export.json").read_text())["metrics"]
    assert record["metrics"] == {name: exported[name] for name in ("adherence", "reward_mean", "fd")}
    decision = _decision(run)
    assert decision["promoted"] and decision["incumbent"] is None
    assert decision["candidate"]["metrics"] == record["metrics"]
    report = (run.path("report") / "report.md").read_text()
    assert "Promotion: promoted: nothing was promoted before" in report


def test_a_worse_export_is_kept_out_and_the_reason_names_the_metric(workspace: Path, tiny_pipeline) -> None:
    metrics = read_promoted(workspace)["metrics"]  # type: ignore[index]
    incumbent = _write_incumbent(workspace, {**metrics, "adherence": metrics["adherence"] + 0.25})
    run = PipelineRun(validate_pipeline(_gated(tiny_pipeline)), workspace)
    planned = {row.node: row for row in plan_run(run)}
    assert [node for node, row in planned.items() if row.status == "run"] == ["promote", "report"]
    assert planned["promote"].reason.startswith("promoted export changed (")

    statuses = _run_all(run)
    assert [node for node, status in statuses.items() if status == "ran"] == ["promote", "report"]
    decision = _decision(run)
    assert not decision["promoted"] and decision["incumbent"] == incumbent
    assert decision["reason"].startswith("kept the promoted export: adherence ")
    assert "(promoted), worse by 0.250" in decision["reason"] and "fd" not in decision["reason"]
    assert json.loads((workspace / "promoted.json").read_text()) == incumbent
    assert f"Promotion: {decision['reason']}" in (run.path("report") / "report.md").read_text()


def test_an_equal_export_is_promoted_and_the_record_moves(workspace: Path, tiny_pipeline) -> None:
    _write_incumbent(workspace, read_promoted(workspace)["metrics"])  # type: ignore[index]
    run = PipelineRun(validate_pipeline(_gated(tiny_pipeline)), workspace)
    assert _run_all(run)["promote"] == "ran" and _decision(run)["promoted"]
    record = read_promoted(workspace)
    assert record is not None and record["fingerprint"] == run.fingerprints["export"] and record["replaced"] == OTHER
    assert run.workspace / record["export"] == run.path("export")
    again = PipelineRun(validate_pipeline(_gated(tiny_pipeline)), workspace)
    assert set(_run_all(again).values()) == {"cached"}  # promoting does not invalidate the decision


def test_init_previous_starts_from_the_promoted_export_and_falls_back_without_one(
    workspace: Path, tiny_pipeline
) -> None:
    config = validate_pipeline(_with_tune(tiny_pipeline))
    run = PipelineRun(config, workspace)
    export = run.workspace / read_promoted(workspace)["export"]  # type: ignore[index]
    trained = run.execute("train.tune")
    assert trained.status == "ran" and trained.outputs["step"] == 3
    assert json.loads((trained.path / "stage.json").read_text())["init_from"] == str(export)

    _write_incumbent(workspace, {"adherence": 0.5, "fd": 1.0}, export=str(export))
    moved = PipelineRun(config, workspace)
    assert moved.fingerprints["train.tune"] != run.fingerprints["train.tune"]
    assert moved.fingerprints["train.sft"] == run.fingerprints["train.sft"]
    assert {row.node: row.reason for row in plan_run(moved)}["train.tune"].startswith("promoted export changed (")

    (workspace / "promoted.json").unlink()
    none = PipelineRun(config, workspace)
    assert len({none.fingerprints["train.tune"], moved.fingerprints["train.tune"], run.fingerprints["train.tune"]}) == 3
    assert none.train_spec("tune", workspace / "scratch").init_from == str(run.path("train.sft") / "final" / "ema")
