"""The ``latents.<name>`` node: declared, wired into the graph and DVC, run and cached, read by SFT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.io import read_json
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.data.latent_cache import read_latent_cache
from flowpost.data.shards import read_shards
from flowpost.errors import FlowpostError
from flowpost.tasks.dvc import dvc_stages
from flowpost.tasks.graph import build_nodes
from flowpost.tasks.runner import PipelineRun

FOLDER = Path(__file__).resolve().parents[1] / "data" / "folder"
TINY = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}


def _pipeline() -> dict[str, Any]:
    """SFT of a one-layer tiny model on the shipped image folder, reading the latent cache ``shapes``."""
    return {
        "name": "latents",
        "datasets": {
            "shapes": {
                "source": "image-folder",
                "path": str(FOLDER),
                "preprocess": {"resolution": 16, "crop": "center", "mode": "grayscale"},
            }
        },
        "conditions": {"minilm": {"datasets": ["shapes"]}},
        "latents": {"shapes": {"dataset": "shapes", "model": {"family": "tiny-sd3"}, "batch_size": 5}},
        "stages": {
            "sft": {
                "trainer": "sft",
                "model": {"family": "tiny-sd3", "transformer": TINY},
                "data": {"dataset": "shapes", "conditions": "minilm", "latents": "shapes"},
                "train": {"lr": 1e-3, "batch_size": 4, "max_steps": 2},
            }
        },
    }


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(FlowpostError) as raised:
        validate_pipeline(data)
    return str(raised.value)


def test_the_cache_is_a_node_before_the_stage_and_a_dvc_stage_of_its_params() -> None:
    pipeline = validate_pipeline(_pipeline())
    nodes = {node.id: node for node in build_nodes(pipeline)}
    assert nodes["latents.shapes"].deps == ("acquire.shapes",)
    assert "latents.shapes" in nodes["train.sft"].deps
    order = list(nodes)
    assert order.index("acquire.shapes") < order.index("latents.shapes") < order.index("train.sft")
    stages = dvc_stages(pipeline)["stages"]
    assert stages["latents.shapes"]["params"] == ["latents.shapes"]
    assert stages["latents.shapes"]["outs"] == ["workspace/latents/shapes"]
    assert "workspace/latents/shapes" in stages["train.sft"]["deps"]


def test_pipelines_without_latents_keep_their_params() -> None:
    data = _pipeline()
    del data["latents"]
    del data["stages"]["sft"]["data"]["latents"]
    dumped = validate_pipeline(data).model_dump(mode="json")
    assert "latents" not in dumped and "latents" not in dumped["stages"]["sft"]["data"]


def test_random_crops_unknown_caches_and_trainers_without_media_are_refused_by_path() -> None:
    crop = _pipeline()
    crop["datasets"]["shapes"]["preprocess"]["crop"] = "random"
    assert "datasets.shapes.preprocess.crop: latents.shapes caches this dataset once" in _error(crop)
    unknown = _pipeline()
    unknown["stages"]["sft"]["data"]["latents"] = "pets"
    assert "stages.sft.data.latents: unknown latents 'pets'" in _error(unknown)
    family = _pipeline()
    family["latents"]["shapes"]["model"] = {"family": "sd3", "pretrained": "some/pipeline"}
    assert "stages.sft.data.latents: cache 'shapes' was encoded by 'sd3'" in _error(family)
    prompts = _pipeline()
    prompts["datasets"]["prompts"] = {"source": "prompt-files", "path": str(FOLDER / "metadata.jsonl")}
    prompts["latents"]["words"] = {"dataset": "prompts"}
    assert "latents.words.dataset: dataset 'prompts' (prompt-files) holds no media" in _error(prompts)
    grpo = _pipeline()
    grpo["stages"]["sft"]["trainer"] = "grpo"
    grpo["stages"]["sft"]["train"] = {"lr": 1e-5}
    grpo["stages"]["sft"]["rewards"] = [{"name": "jpeg_incompressibility"}]
    assert "stages.sft.data.latents: trainer 'grpo' encodes no dataset media" in _error(grpo)


def test_the_node_encodes_each_training_record_once_and_is_reused(tmp_path: Path) -> None:
    run = PipelineRun(validate_pipeline(_pipeline()), tmp_path / "ws")
    run.execute("acquire.shapes")
    result = run.execute("latents.shapes")
    assert result.status == "ran"
    train_dir = run.path("acquire.shapes") / "train"
    manifest, latents = read_latent_cache(result.path, train_dir)
    assert manifest["codec_fingerprint"] == TinySD3Adapter.from_scratch(seed=1).codec_fingerprint()
    assert manifest["preprocess"] == {
        "resolution": 16,
        "crop": "center",
        "mode": "grayscale",
        "seed": 0,
        "background": "white",
        "max_megapixels": 100.0,
    }
    records = read_shards(train_dir, read_json(train_dir / "manifest.json"))
    assert [r.key for r in latents] == [r.key for r in records] and len(set(manifest["item_hashes"])) == len(records)
    for record, cached in zip(records, latents, strict=True):
        np.testing.assert_array_equal(cached.image, record.image * 2.0 - 1.0)  # the identity codec, to [-1, 1]
    assert run.execute("latents.shapes").status == "cached"


def test_a_cache_of_another_dataset_version_is_refused(tmp_path: Path) -> None:
    run = PipelineRun(validate_pipeline(_pipeline()), tmp_path / "ws")
    run.execute("acquire.shapes")
    cache = run.execute("latents.shapes").path
    changed = _pipeline()
    changed["datasets"]["shapes"]["split"] = {"eval": 0.2}  # other training records
    other = PipelineRun(validate_pipeline(changed), tmp_path / "ws")
    other.execute("acquire.shapes")
    with pytest.raises(FlowpostError, match="another version of the dataset") as raised:
        read_latent_cache(cache, other.path("acquire.shapes") / "train")
    assert raised.value.where == str(cache)


@pytest.mark.slow  # two short training processes
def test_a_stage_trained_on_the_cache_ends_with_the_weights_of_one_encoding_every_step(tmp_path: Path) -> None:
    weights = {}
    for arm, latents in (("cached", "shapes"), ("encoded", None)):
        data = _pipeline()
        data["stages"]["sft"]["data"]["latents"] = latents
        run = PipelineRun(validate_pipeline(data), tmp_path / arm)
        for node in ("acquire.shapes", "conditions.minilm", *(["latents.shapes"] if latents else []), "train.sft"):
            run.execute(node)
        files = sorted((run.path("train.sft") / "final").rglob("*.safetensors"))
        weights[arm] = {f.relative_to(run.path("train.sft")).as_posix(): load_file(f) for f in files}
    assert weights["cached"].keys() == weights["encoded"].keys() and weights["cached"]
    for name, tensors in weights["encoded"].items():
        for key, value in tensors.items():
            assert torch.equal(weights["cached"][name][key], value), f"{name}:{key}"
