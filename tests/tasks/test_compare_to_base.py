"""``evaluate.compare_to_base``: each evaluated stage and its base model (what the first stage of its init chain
starts from) sampled with the same prompts and noise; per metric the base's value, the paired difference and its
interval, in the evaluation's and the report's metrics.json and in report.md. Off, the params and fingerprints
are those of a pipeline without it."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from diffusers import SD3Transformer2DModel

from flowpost.core.config.loading import pipeline_to_dict, validate_pipeline
from flowpost.core.evaluation.paired import Scores, compare_with_base, per_category
from flowpost.core.models.sd3 import SD3Adapter
from flowpost.tasks.base_model import base_params, base_stage, load_base_model
from flowpost.tasks.dvc import dvc_stages
from flowpost.tasks.graph import build_nodes, fingerprints
from flowpost.tasks.runner import PipelineRun

REPO = Path(__file__).resolve().parents[2]
REWARD = "jpeg_compressibility"  # scored sample by sample: paired over samples
STATISTIC = "brightness"  # scored as a set: paired over seeds


def _folder_pipeline(tiny_pipeline: Any, *, lr: float = 3e-4) -> dict[str, Any]:
    """``examples/folder-sft.yaml`` with the tests' tiny transformer, two steps of ``lr`` and a small evaluation
    of the live weights over two seeds, compared with the base model."""
    config = yaml.safe_load((REPO / "examples" / "folder-sft.yaml").read_text())
    config["smoke"] = True
    config["datasets"]["shapes"]["path"] = str(REPO / "tests" / "data" / "folder")
    sft = config["stages"]["sft"]
    sft["model"]["transformer"] = copy.deepcopy(tiny_pipeline()["stages"]["sft"]["model"]["transformer"])
    sft["train"].update(max_steps=2, warmup_steps=0, checkpoint_every=0, lr=lr)
    config["evaluate"].update(
        metrics=[STATISTIC, REWARD], samples=4, seeds=[0, 1], steps=2, batch_size=4, weights="live"
    )
    config["evaluate"]["compare_to_base"] = True
    return config


def test_off_it_is_left_out_of_the_params_and_the_fingerprints(tiny_pipeline) -> None:
    on = _folder_pipeline(tiny_pipeline)
    off = copy.deepcopy(on)
    del off["evaluate"]["compare_to_base"]
    explicit_off = copy.deepcopy(on)
    explicit_off["evaluate"]["compare_to_base"] = False
    pipelines = [validate_pipeline(config) for config in (off, explicit_off, on)]
    assert "compare_to_base" not in pipeline_to_dict(pipelines[1])["evaluate"]
    prints = [fingerprints(build_nodes(p), code="code") for p in pipelines]
    assert prints[0] == prints[1]
    assert prints[2]["eval.sft"] != prints[0]["eval.sft"] and prints[2]["train.sft"] == prints[0]["train.sft"]
    node = next(n for n in build_nodes(pipelines[2]) if n.id == "eval.sft")
    assert node.config["base"] == base_params(pipelines[2], "sft")
    assert node.config["base"]["family"] == "tiny-sd3" and node.config["base"]["transformer"]
    params = [dvc_stages(p)["stages"]["eval.sft"]["params"] for p in (pipelines[0], pipelines[2])]
    assert not any(key.startswith("stages.sft.model") for key in params[0])
    assert {"stages.sft.model.family", "stages.sft.model.transformer"} <= set(params[1])  # dvc reruns it too


def test_the_base_is_what_the_first_stage_of_the_init_chain_starts_from(tiny_pipeline) -> None:
    config = _folder_pipeline(tiny_pipeline)
    later = copy.deepcopy(config["stages"]["sft"])
    later["model"] = {**later["model"], "init": "sft", "transformer": {}}
    promoted = copy.deepcopy(later)
    promoted["model"] = {**promoted["model"], "init": "previous", "fallback": "polish"}
    config["stages"] |= {"polish": later, "nightly": promoted}
    config["evaluate"]["after"] = ["sft", "polish", "nightly"]
    config["export"] |= {"from": "nightly", "promote": {"metrics": [REWARD]}}
    pipeline = validate_pipeline(config)
    assert [base_stage(pipeline, name) for name in ("sft", "polish", "nightly")] == ["sft"] * 3
    assert base_params(pipeline, "nightly") == base_params(pipeline, "sft")
    changed = copy.deepcopy(config)
    changed["stages"]["sft"]["model"]["transformer"]["num_layers"] = 2
    before, after = (fingerprints(build_nodes(validate_pipeline(c)), code="code") for c in (config, changed))
    assert before["eval.nightly"] != after["eval.nightly"]  # its base changed with the first stage's model


def test_differences_pair_samples_for_per_sample_scores_and_seeds_otherwise() -> None:
    rows = [{"seed": 0, "r": 0.5, "s": 2.0}, {"seed": 1, "r": 1.0, "s": 4.0}]
    base_rows = [{"seed": 0, "r": 0.25, "s": 1.0}, {"seed": 1, "r": 0.5, "s": 1.0}]
    candidate = Scores(rows, {"r": [0.0, 1.0, 1.0, 1.0]}, ["a", "b", "a", "b"])
    base = Scores(base_rows, {"r": [0.0, 0.5, 0.5, 0.5]})
    result = compare_with_base(candidate, base)
    assert result["r"]["paired"] == "samples" and result["r"]["n"] == 4
    assert result["r"]["base"] == pytest.approx(0.375) and result["r"]["difference"] == pytest.approx(0.375)
    low, high = result["r"]["interval"]  # differences 0, .5, .5, .5: mean .375, s .25, t(.975, 3) 3.182
    assert (low, high) == pytest.approx((0.375 - 3.1824 * 0.25 / 2, 0.375 + 3.1824 * 0.25 / 2), abs=1e-4)
    # differences 1, 3: mean 2, s sqrt(2), t(.975, 1) 12.706, half-width 12.706 * sqrt(2) / sqrt(2)
    interval = pytest.approx([2.0 - 12.706, 2.0 + 12.706], abs=1e-3)
    assert result["s"] == {"base": 1.0, "difference": 2.0, "paired": "seeds", "n": 2, "interval": interval}
    assert per_category(candidate) == {"r": {"a": 0.5, "b": 1.0}}
    assert per_category(base) == {}  # no categories
    with pytest.raises(ValueError, match="different seeds"):
        compare_with_base(candidate, Scores([{**row, "seed": 9} for row in base_rows]))


def _run(config: dict[str, Any], workspace: Path) -> PipelineRun:
    run = PipelineRun(validate_pipeline(config), workspace)
    for node in run.nodes:
        assert run.execute(node).status == "ran", node
    return run


@pytest.mark.slow  # two tiny folder pipelines end to end, one evaluation rerun: about a minute on 2 cores
def test_a_run_writes_the_base_values_and_paired_differences_exactly_reproducibly(tiny_pipeline, tmp_path) -> None:
    run = _run(_folder_pipeline(tiny_pipeline), tmp_path / "trained")
    result = json.loads((run.path("eval.sft") / "metrics.json").read_text())
    assert set(result["vs_base"]) == {STATISTIC, REWARD}
    assert result["vs_base"][REWARD]["paired"] == "samples" and result["vs_base"][REWARD]["n"] == 8
    assert result["vs_base"][STATISTIC]["paired"] == "seeds" and result["vs_base"][STATISTIC]["n"] == 2
    for key, entry in result["vs_base"].items():
        assert entry["difference"] == pytest.approx(result[key] - result["base"][key], abs=1e-6)  # float32 means
        assert entry["interval"][0] <= entry["difference"] <= entry["interval"][1]
    assert result["vs_base"][REWARD]["difference"] != 0.0  # two steps at lr 3e-4 moved the samples
    report = json.loads((run.path("report") / "metrics.json").read_text())["sft"]
    assert report["vs_base"] == result["vs_base"] and report["base"] == result["base"]
    text = (run.path("report") / "report.md").read_text()
    assert "## Against the base model" in text and f"| sft | {REWARD} |" in text
    again = run.execute("eval.sft", force=True)
    assert again.status == "ran"
    rerun = json.loads((run.path("eval.sft") / "metrics.json").read_text())
    assert (rerun["base"], rerun["vs_base"]) == (result["base"], result["vs_base"])  # exactly the same numbers

    # a stage whose steps are far below the weights' precision keeps its starting weights bit for bit: it is its
    # base, so every paired difference is exactly zero
    still = _run(_folder_pipeline(tiny_pipeline, lr=1e-30), tmp_path / "still")
    result = json.loads((still.path("eval.sft") / "metrics.json").read_text())
    assert {key: entry["difference"] for key, entry in result["vs_base"].items()} == {STATISTIC: 0.0, REWARD: 0.0}
    assert result["base"] == {key: result[key] for key in (STATISTIC, REWARD)}


def test_a_pretrained_base_is_its_pipeline_without_the_stages_lora(tiny_pipeline, sd3_pipeline_dir) -> None:
    from pretrained_stage import with_model

    config = with_model(tiny_pipeline, {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "lora": {"rank": 2}})
    config["evaluate"]["compare_to_base"] = True
    pipeline = validate_pipeline(config)
    assert base_params(pipeline, "sft") == {
        "family": "sd3",
        "pretrained": str(sd3_pipeline_dir),
        "shift": 1.0,
        "transformer": {},
    }
    base = load_base_model(pipeline, "sft")
    assert isinstance(base, SD3Adapter) and base.lora is None
    shipped = SD3Transformer2DModel.from_pretrained(sd3_pipeline_dir / "transformer").state_dict()
    loaded = base.module().state_dict()
    assert set(loaded) == set(shipped) and all(torch.equal(loaded[k], shipped[k].to(loaded[k].dtype)) for k in shipped)
