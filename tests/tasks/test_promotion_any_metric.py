"""The promotion gate on any metric the evaluation produces: a reward scored as a metric (better: higher), a
plugin metric by its key with the direction its class declares, or a direction the gate gives. A tiny SD3-family
stage trained on an image folder is promoted when its gated reward is better and kept out when it is worse."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowpost.core.config.loading import apply_overrides, pipeline_to_dict, validate_pipeline
from flowpost.errors import FlowpostError
from flowpost.tasks.promote import read_promoted
from flowpost.tasks.runner import PipelineRun

REPO = Path(__file__).resolve().parents[2]
GATED = "jpeg_compressibility"  # a reward as a metric: minus the JPEG size in kB, nothing to download
METRIC_MODULE = '''
class Blur:
    """The mean image value, standing in for a metric that is better low."""

    name = "blur"
    better = "lower"

    def __call__(self, samples):
        return float(samples.images.mean())
'''


def _folder_pipeline(tiny_pipeline: Any) -> dict[str, Any]:
    """``examples/folder-sft.yaml`` with the tests' tiny transformer, two steps and a small evaluation of an
    image statistic and a reward, its export gated on the reward (its own direction)."""
    config = yaml.safe_load((REPO / "examples" / "folder-sft.yaml").read_text())
    config["smoke"] = True
    config["datasets"]["shapes"]["path"] = str(REPO / "tests" / "data" / "folder")
    sft = config["stages"]["sft"]
    sft["model"]["transformer"] = copy.deepcopy(tiny_pipeline()["stages"]["sft"]["model"]["transformer"])
    sft["train"].update(max_steps=2, warmup_steps=0, checkpoint_every=0)
    sft["callbacks"] = {"ema": {"decay": 0.9}}
    config["evaluate"].update(metrics=["brightness", GATED], samples=4, seeds=[0], steps=2, batch_size=4)
    config["export"]["promote"] = {"metrics": [GATED]}
    return config


def _refusal(config: dict[str, Any], overrides: list[str]) -> str:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(apply_overrides(config, overrides))
    return str(info.value)


def test_a_listed_metric_takes_its_own_direction_into_the_params(tiny_pipeline) -> None:
    pipeline = validate_pipeline(_folder_pipeline(tiny_pipeline))
    assert pipeline_to_dict(pipeline)["export"]["promote"]["metrics"] == {GATED: "higher"}
    given = validate_pipeline(
        apply_overrides(_folder_pipeline(tiny_pipeline), ["export.promote.metrics={brightness: lower}"])
    )
    assert given.export is not None and given.export.promote is not None
    assert given.export.promote.metrics == {"brightness": "lower"}


def test_a_metric_without_a_direction_needs_one_in_the_gate(tiny_pipeline) -> None:
    message = _refusal(_folder_pipeline(tiny_pipeline), ["export.promote.metrics=[brightness]"])
    assert "export.promote.metrics.brightness: 'brightness' declares no direction" in message


def test_a_gated_metric_the_evaluation_does_not_produce_is_named_with_those_it_does(tiny_pipeline) -> None:
    message = _refusal(_folder_pipeline(tiny_pipeline), ["export.promote.metrics={pickscore: higher}"])
    assert "export.promote.metrics: unknown metric 'pickscore'; the evaluation (evaluate.metrics) produces: " in message
    assert message.endswith(f"brightness, {GATED}") or f"brightness, {GATED}\n" in message


def test_a_plugin_metric_is_gated_by_its_key_in_the_direction_its_class_declares(
    tiny_pipeline, tmp_path, monkeypatch
) -> None:
    (tmp_path / "gate_metrics.py").write_text(METRIC_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _folder_pipeline(tiny_pipeline)
    config["evaluate"]["metrics"].append({"name": "gate_metrics:Blur", "key": "blur_level"})
    config["export"]["promote"]["metrics"] = ["blur_level", GATED]
    pipeline = validate_pipeline(config)
    assert pipeline.export is not None and pipeline.export.promote is not None
    assert pipeline.export.promote.metrics == {"blur_level": "lower", GATED: "higher"}


@pytest.fixture(scope="module")
def promoted(tmp_path_factory: pytest.TempPathFactory, tiny_pipeline) -> tuple[Path, dict[str, Any]]:
    """A workspace where the gated folder pipeline ran once, and the promoted record it left."""
    workspace = tmp_path_factory.mktemp("gated")
    run = PipelineRun(validate_pipeline(_folder_pipeline(tiny_pipeline)), workspace)
    assert {run.execute(node).status for node in run.nodes} == {"ran"}
    record = read_promoted(workspace)
    assert record is not None
    return workspace, record


def _judged_against(workspace: Path, tiny_pipeline: Any, incumbent: float, fingerprint: str) -> dict[str, Any]:
    """The gate's decision on the same export against another promoted export (``fingerprint``) whose gated
    reward is ``incumbent``."""
    record = json.loads((workspace / "promoted.json").read_text())
    record = {**record, "fingerprint": fingerprint, "metrics": {**record["metrics"], GATED: incumbent}}
    (workspace / "promoted.json").write_text(json.dumps(record))
    run = PipelineRun(validate_pipeline(_folder_pipeline(tiny_pipeline)), workspace)
    assert run.execute("promote").status == "ran"
    return json.loads((run.path("promote") / "promotion.json").read_text())


def test_the_first_export_is_promoted_with_every_evaluated_metric(promoted) -> None:
    _, record = promoted
    assert set(record["metrics"]) == {"brightness", GATED} and record["metrics"][GATED] < 0  # minus kB


def test_a_better_reward_is_promoted_and_a_worse_one_is_kept_out(promoted, tiny_pipeline) -> None:
    workspace, record = promoted
    value = record["metrics"][GATED]
    worse = _judged_against(workspace, tiny_pipeline, value + 0.5, "1" * 64)
    assert not worse["promoted"]
    assert worse["reason"] == (
        f"kept the promoted export: {GATED} {value:.3f} < {value + 0.5:.3f} (promoted), worse by 0.500"
    )
    better = _judged_against(workspace, tiny_pipeline, value - 0.5, "2" * 64)
    assert better["promoted"] and better["reason"].startswith(f"promoted: no metric regressed ({GATED} {value:.3f}")
    assert read_promoted(workspace)["replaced"] == "2" * 64  # type: ignore[index]
