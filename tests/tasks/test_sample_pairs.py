"""The sampled-pairs acquisition: best/worst pairs, bit-identical reruns, its place in the graph, config errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from flowpost.core.conditions import ConditionBatch
from flowpost.core.config.loading import validate_pipeline
from flowpost.core.config.schema import SampledPairsConfig
from flowpost.core.io import read_json, write_json_atomic
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.data.condition_cache import update_condition_cache
from flowpost.data.records import Demonstration
from flowpost.data.shards import read_pair_shards, write_shards
from flowpost.errors import FlowpostError
from flowpost.tasks.graph import build_nodes, fingerprints
from flowpost.tasks.sample_pairs import sample_pairs

TINY = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}
FINGERPRINT = "test-encoder"
PROMPTS = [f"digit {d}" for d in range(3)]


def _encode(prompts: list[str]) -> ConditionBatch:
    states = torch.stack([torch.randn(16, 384, generator=torch.Generator().manual_seed(len(p))) for p in prompts])
    return ConditionBatch(states, torch.ones(len(prompts), 16, dtype=torch.int8), states.mean(1))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A saved tiny model as a finished stage, a dataset of three labelled prompts, and their conditions."""
    root = tmp_path_factory.mktemp("pairs")
    TinySD3Adapter.from_scratch(seed=0, overrides=TINY).save_pretrained(root / "stage" / "final" / "live")
    images = np.zeros((1, 16, 16), dtype=np.float32)
    records = [Demonstration(key=f"r{i}", prompt=p, image=images, label=i) for i, p in enumerate(PROMPTS)]
    manifest = write_shards(records, root / "data" / "train")
    write_json_atomic(root / "data" / "train" / "manifest.json", manifest)
    update_condition_cache(root / "conditions", ["", *PROMPTS], encoder_fingerprint=FINGERPRINT, encode=_encode)
    return {"stage_dir": root / "stage", "prompts_dir": root / "data", "conditions_dir": root / "conditions"}


def _sample(dirs: dict[str, Path], out: Path, **fields) -> dict:
    config = SampledPairsConfig(
        stage="sft",
        prompts="digits",
        conditions="minilm",
        rewards=[{"name": "jpeg_incompressibility"}],
        candidates=4,
        rounds=2,
        steps=2,
        **fields,
    )
    return sample_pairs(config, dataset="pairs", encoder_fingerprint=FINGERPRINT, out_dir=out, seed=0, **dirs)


def test_pairs_are_each_groups_best_and_worst_and_a_rerun_is_bit_identical(dirs, tmp_path):
    manifest = _sample(dirs, tmp_path / "a")
    assert manifest["counts"] == {"train": 6, "eval": 0, "skipped_groups": 0}  # 3 prompts x 2 rounds
    train = tmp_path / "a" / "train"
    pairs = read_pair_shards(train, read_json(train / "manifest.json"))
    assert sorted((p.prompt, p.label) for p in pairs) == sorted((p, i) for i, p in enumerate(PROMPTS) for _ in "ab")
    assert all(p.metadata["chosen_reward"] > p.metadata["rejected_reward"] for p in pairs)
    assert all(p.metadata["chosen_candidate"] != p.metadata["rejected_candidate"] for p in pairs)
    assert not np.array_equal(pairs[0].chosen, pairs[3].chosen)  # the second round draws new candidates
    assert manifest["rewards"]["gap_mean"] > 0
    again = _sample(dirs, tmp_path / "b")
    assert again["shards"] == manifest["shards"]  # same file hashes: the noise is addressed


def test_a_gap_no_group_reaches_is_an_error_naming_min_gap(dirs, tmp_path):
    with pytest.raises(FlowpostError, match="reward gap of at least 1000") as error:
        _sample(dirs, tmp_path, min_gap=1000.0)
    assert error.value.where == "datasets.pairs.sample.min_gap"


def _pipeline(tiny_pipeline, **sample) -> dict:
    config = tiny_pipeline()
    config["datasets"]["pairs"] = {
        "source": "sampled-pairs",
        "sample": {
            "stage": "sft",
            "prompts": "digits",
            "conditions": "minilm",
            "rewards": [{"name": "digit_adherence"}],
            **sample,
        },
    }
    config["stages"]["dpo"] = {
        "trainer": "offline-dpo",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "pairs", "conditions": "minilm"},
        "train": {"batch_size": 4, "max_steps": 2},
    }
    return config


def test_the_pairs_node_runs_after_its_stage_and_changes_with_it(tiny_pipeline):
    nodes = build_nodes(validate_pipeline(_pipeline(tiny_pipeline)))
    order = [node.id for node in nodes]
    pairs = next(node for node in nodes if node.id == "acquire.pairs")
    assert set(pairs.deps) == {"train.sft", "acquire.digits", "conditions.minilm"}
    assert order.index("train.sft") < order.index("acquire.pairs") < order.index("train.dpo")
    assert "acquire.pairs" in next(node for node in nodes if node.id == "train.dpo").deps
    before = fingerprints(nodes, code="c")
    changed = _pipeline(tiny_pipeline)
    changed["stages"]["sft"]["train"]["lr"] = 2e-3
    after = fingerprints(build_nodes(validate_pipeline(changed)), code="c")
    assert before["acquire.digits"] == after["acquire.digits"]
    assert before["acquire.pairs"] != after["acquire.pairs"] and before["train.dpo"] != after["train.dpo"]


def _error(config: dict) -> str:
    with pytest.raises((FlowpostError, ValidationError)) as error:
        validate_pipeline(config)
    return str(error.value)


def test_config_errors_name_the_path(tiny_pipeline):
    assert "datasets.pairs.sample.stage: unknown stage 'sfx'" in _error(_pipeline(tiny_pipeline, stage="sfx"))
    assert "datasets.pairs.sample.prompts" in _error(_pipeline(tiny_pipeline, prompts="pairs"))
    assert "datasets.pairs.sample.conditions" in _error(_pipeline(tiny_pipeline, conditions="other"))
    unranked = _pipeline(tiny_pipeline)
    del unranked["datasets"]["pairs"]["sample"]["rewards"]
    assert "datasets.pairs.sample.rewards: Field required" in _error(unranked)  # no reward is assumed
    cached = _pipeline(tiny_pipeline)
    cached["conditions"]["minilm"]["datasets"].append("pairs")
    assert "conditions.minilm.datasets.1: dataset 'pairs' is sampled" in _error(cached)
    early = _pipeline(tiny_pipeline, stage="dpo")
    assert "stages.dpo.data.dataset: dataset 'pairs' samples stage 'dpo', which must come earlier" in _error(early)
    typo = _pipeline(tiny_pipeline)
    typo["stages"]["dpo"]["train"]["betta"] = 10
    assert "stages.dpo.train" in _error(typo) and "betta" in _error(typo)
    bad_loss = _pipeline(tiny_pipeline)
    bad_loss["stages"]["dpo"]["train"]["loss_type"] = "squared"
    assert "loss_type" in _error(bad_loss)
    path_and_sample = _pipeline(tiny_pipeline)
    path_and_sample["datasets"]["pairs"]["path"] = "x.csv"
    assert "'path' is required for sources" in _error(path_and_sample)
    columns = tiny_pipeline()
    columns["datasets"]["digits"]["chosen_column"] = "good"
    assert "chosen_column do not apply to source 'builtin-digits'" in _error(columns)
