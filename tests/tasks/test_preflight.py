"""The memory preflight: the stage's network sized from its pipeline's configs alone, and ``flowpost plan``'s table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from plugin_site import on_path
from pretrained_stage import with_model
from tiny_flux1_pipeline import RESOLUTION
from tiny_wan2_pipeline import FRAMES, HEIGHT, WIDTH

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.live_bytes import FusedAttention, LiveBytes
from flowpost.core.memory import SNAPSHOT_ITEMSIZE
from flowpost.core.models.footprint import model_footprint
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.registry import TRAINERS
from flowpost.core.trainers.spec import StageSpec
from flowpost.stage import build_adapter
from flowpost.tasks import preflight
from flowpost.tasks.preflight import encode_bytes, micro_batch_per_gpu, over_budget, stage_memory, stage_snapshots

ROOT = Path(__file__).parents[2]
SHAPES = ROOT / "docs" / "shapes"
OPTIONS: dict[str, dict[str, Any]] = {
    "sd3": {},
    "flux1": {"resolution": RESOLUTION},
    "flux2": {"resolution": RESOLUTION},
    "flux2-klein": {"resolution": RESOLUTION},
    "qwen-image": {"resolution": RESOLUTION},
    "wan2": {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES, "gradient_checkpointing": True},
    "wan22-a14b": {"height": HEIGHT, "width": WIDTH, "num_frames": FRAMES, "gradient_checkpointing": True},
    "z-image": {"resolution": RESOLUTION},
}
FIXTURES = {"sd3": "sd3", "flux1": "flux1", "qwen-image": "qwen_image", "wan2": "wan2", "wan22-a14b": "wan22"}


def _config(tiny_pipeline, model: dict[str, Any], **stage: Any) -> dict[str, Any]:
    config = with_model(tiny_pipeline, model)  # trains on RGB images, through its own family's encoders
    config["stages"]["sft"].update(stage)
    config["conditions"]["own"]["max_length"] = 8
    return config


@pytest.fixture(params=sorted(OPTIONS))
def family_dir(request: pytest.FixtureRequest) -> tuple[str, Path]:
    fixture = FIXTURES.get(request.param, request.param.replace("-", "_"))
    return request.param, request.getfixturevalue(f"{fixture}_pipeline_dir")


@pytest.mark.parametrize("lora", [None, {"rank": 2}], ids=["full", "lora"])
def test_the_estimates_parameter_part_is_the_loaded_models(
    tiny_pipeline, family_dir: tuple[str, Path], lora: dict | None, tmp_path: Path
) -> None:
    family, folder = family_dir
    model = {"family": family, "pretrained": str(folder), "options": OPTIONS[family], "lora": lora}
    config = validate_pipeline(_config(tiny_pipeline, model))
    [row] = stage_memory(config)
    loaded = build_adapter(config.stages["sft"], StageSpec(stage="sft", seed=0, config={}, output_dir=str(tmp_path)))
    assert row.footprint == model_footprint(loaded)  # counts, bytes, blocks, width, tokens, checkpointing
    params = list(loaded.module().parameters())
    assert row.footprint.parameters == sum(p.numel() for p in params)
    assert row.footprint.trainable == sum(p.numel() for p in params if p.requires_grad)
    assert (row.fine_tune == "full") == (lora is None) and row.footprint.checkpointed == (
        row.footprint.blocks if family.startswith("wan2") else 0
    )


@pytest.mark.parametrize(("family", "fixture"), [("sd3", "sd3"), ("qwen-image", "qwen_image"), ("wan2", "wan2")])
def test_the_vae_encode_is_sized_as_the_loaded_vae_encodes_the_stages_batch(
    tiny_pipeline, family: str, fixture: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The meta-device trace of the encode holds what the loaded VAE's encode of a micro-batch of the family's
    pixels holds on real tensors (an image VAE, an image through a video VAE, videos one at a time), attention
    sized as a fused kernel in both; a stage reading a latent cache encodes nothing."""
    folder = request.getfixturevalue(f"{fixture}_pipeline_dir")
    model = {"family": family, "pretrained": str(folder), "options": OPTIONS[family]}
    config = validate_pipeline(_config(tiny_pipeline, model))
    [row] = stage_memory(config)
    stage = config.stages["sft"]
    loaded = build_adapter(stage, StageSpec(stage="sft", seed=0, config={}, output_dir=str(tmp_path)))
    pixels, vae = torch.rand(micro_batch_per_gpu(stage), *loaded.pixel_shape) * 2 - 1, loaded.vae  # loaded before
    with torch.no_grad(), FusedAttention(), LiveBytes() as live:
        latents = vae.encode(pixels).latent_dist.mode()
    assert row.estimate is not None and row.estimate.codec_activations == pytest.approx(live.peak, rel=0.01)
    assert live.peak > 4 * latents.nbytes
    cached = stage.model_copy(update={"data": stage.data.model_copy(update={"latents": "cache"})})
    assert encode_bytes(cached, stage.model, row.footprint) == 0


def test_stages_without_a_real_family_get_no_row_and_an_init_chain_finds_its_pipeline(
    tiny_pipeline, flux1_pipeline_dir: Path
) -> None:
    assert stage_memory(validate_pipeline(tiny_pipeline())) == []
    model = {"family": "flux1", "pretrained": str(flux1_pipeline_dir), "options": OPTIONS["flux1"]}
    config = _config(tiny_pipeline, model)
    config["stages"]["more"] = {**config["stages"]["sft"], "model": {"family": "flux1", "init": "sft"}}
    rows = stage_memory(validate_pipeline(config))
    assert [row.stage for row in rows] == ["sft", "more"] and rows[0].footprint == rows[1].footprint


def test_snapshots_follow_the_trainer_and_callbacks(tiny_pipeline, flux1_pipeline_dir: Path) -> None:
    model = {"family": "flux1", "pretrained": str(flux1_pipeline_dir), "options": OPTIONS["flux1"]}

    def names(trainer: str, train: dict[str, Any], ema: bool) -> set[str]:
        rewards = [] if trainer == "sft" else [{"name": "jpeg_compressibility"}]
        config = _config(tiny_pipeline, model, trainer=trainer, train=train, rewards=rewards)
        config["stages"]["sft"]["callbacks"] = {"ema": {"decay": 0.9}} if ema else {}
        return set(stage_snapshots(validate_pipeline(config).stages["sft"]))

    assert names("sft", {"max_steps": 1}, ema=True) == {"ema"}
    assert names("grpo", {"iterations": 1, "kl_beta": 0.04}, ema=False) == {"ref"}
    assert names("grpo", {"iterations": 1}, ema=False) == set()
    assert names("nft", {"iterations": 1, "kl_beta": 0.0}, ema=True) == {"ema", "old"}
    assert names("awm", {"iterations": 1, "kl_beta": 0.001, "ema_kl_beta": 0.1}, ema=False) == {"ref", "anchor"}


PLUGIN = """
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.offline.sft import SFTTrainer


class AnchoredSFT(SFTTrainer):
    captured_snapshots = {**SFTTrainer.captured_snapshots, Snapshot.ANCHOR: None}
"""


def test_a_plugin_trainers_declared_snapshot_is_counted(
    tiny_pipeline, flux1_pipeline_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "anchored_sft.py").write_text(PLUGIN)
    model = {"family": "flux1", "pretrained": str(flux1_pipeline_dir), "options": OPTIONS["flux1"]}
    config = _config(tiny_pipeline, model)
    config["stages"]["plugin"] = {**config["stages"]["sft"], "trainer": "anchored_sft:AnchoredSFT"}
    with on_path(tmp_path, monkeypatch):
        sft, plugin = stage_memory(validate_pipeline(config))
    assert plugin.footprint == sft.footprint and sft.estimate is not None and plugin.estimate is not None
    one = sft.footprint.trainable * SNAPSHOT_ITEMSIZE
    assert sft.estimate.snapshots == one  # the EMA callback's
    assert plugin.estimate.snapshots - sft.estimate.snapshots == one
    assert plugin.estimate.total - sft.estimate.total == one


def test_the_preflight_names_no_trainer() -> None:
    source = Path(preflight.__file__).read_text()
    assert [name for name in TRAINERS if f'"{name}"' in source] == []
    assert [name for name in Snapshot if f'"{name}"' in source] == []


def _shape_pipeline(
    tmp_path: Path, lora: dict | None, *, shape: str = "flux1-dev", family: str = "flux1"
) -> dict[str, Any]:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\n")
    folder = str(SHAPES / shape)
    model = {"family": family, "pretrained": folder, "torch_dtype": "bfloat16", "options": {"resolution": 512}}
    return {
        "name": "flux-shape",
        "datasets": {"prompts": {"source": "prompt-files", "path": str(prompts)}},
        "conditions": {"flux": {"model": {"family": family, "pretrained": folder}, "datasets": ["prompts"]}},
        "stages": {
            "grpo": {
                "trainer": "grpo",
                "model": {**model, "lora": lora},
                "data": {"dataset": "prompts", "conditions": "flux"},
                "rewards": [{"name": "jpeg_compressibility"}],
                "train": {"iterations": 1, "prompts_per_iteration": 1, "group_size": 2, "train_batch_size": 1},
                "launch": {"mixed_precision": "bf16"},
            }
        },
        "evaluate": {"after": []},
    }


def test_the_published_flux_shape_fits_80_gib_with_lora_not_fully_fine_tuned(tmp_path: Path) -> None:
    """FLUX.1-dev's transformer (11.9 B parameters) from its config alone, bf16 weights, one sample per GPU."""
    [full] = stage_memory(validate_pipeline(_shape_pipeline(tmp_path, None)))
    assert full.footprint is not None and full.estimate is not None
    assert round(full.footprint.parameters / 1e9, 2) == 11.90 and full.footprint.trainable == full.footprint.parameters
    # fully trained: fp32 master weights, gradients and AdamW moments, whatever torch_dtype loads
    assert full.footprint.weight_bytes == full.footprint.trainable_bytes == 4 * full.footprint.parameters
    assert full.estimate.optimizer == 2 * full.estimate.gradients == 8 * full.footprint.parameters
    assert [warning.split(":")[0] for warning in over_budget([full], 80)] == ["stages.grpo"]
    [lora] = stage_memory(validate_pipeline(_shape_pipeline(tmp_path, {"rank": 32})))
    assert lora.footprint is not None and lora.footprint.trainable < full.footprint.parameters / 100
    assert lora.footprint.trainable_bytes == 4 * lora.footprint.trainable  # fp32 adapters over the bf16 base
    assert lora.footprint.weight_bytes == 2 * (lora.footprint.parameters - lora.footprint.trainable) + 4 * (
        lora.footprint.trainable
    )
    assert over_budget([lora], 80) == []


def test_both_wan22_a14b_experts_count_and_one_runs_each_sample(tmp_path: Path) -> None:
    """Wan2.2-T2V-A14B's two 14.29 B experts from their configs: both held under their LoRA adapters, each
    sample's activations through one expert's 40 blocks."""
    pipeline = _shape_pipeline(tmp_path, {"rank": 32}, shape="wan2.2-t2v-a14b", family="wan22-a14b")
    pipeline["stages"]["grpo"]["model"]["options"] = {"height": 480, "width": 832, "num_frames": 33}
    [row] = stage_memory(validate_pipeline(pipeline))
    assert row.footprint is not None and row.estimate is not None
    assert row.footprint.parameters - row.footprint.trainable == 2 * 14_288_491_584
    assert row.footprint.blocks == 40 and row.footprint.hidden == 5120
    assert row.footprint.image_tokens == 9 * 30 * 52  # 33 frames at 480 x 832
    assert row.estimate.weights > 2 * 2 * 14.28e9  # both experts' bf16 weights


def test_flux2_klein_s_widest_projection_is_its_single_stream_blocks_fused_one(tmp_path: Path) -> None:
    """FLUX.2-klein-base-4B's single-stream blocks project to q, k, v (3 x 3072) and the gated MLP's two halves
    (2 x 3 x 3072) in one layer: the backward transient is sized on its 27648 outputs, under LoRA as without."""
    pipeline = _shape_pipeline(tmp_path, {"rank": 32}, shape="flux2-klein-base-4b", family="flux2-klein")
    [row] = stage_memory(validate_pipeline(pipeline))
    assert row.footprint is not None and row.estimate is not None
    assert row.footprint.hidden == 3072 and row.footprint.widest_projection == 9 * 3072
    tokens = row.footprint.image_tokens + 16  # the conditions' default max_length
    assert row.estimate.backward_transient == 3 * tokens * 9 * 3072 * 2  # one bf16 sample


def test_buffers_count_with_the_weights(tmp_path: Path) -> None:
    """SD3.5-Medium keeps its sin-cos position table (384 x 384 positions x 1536) as a buffer, in bf16 beside the
    weights: 0.42 GiB that a parameter count alone leaves out."""
    [lora] = stage_memory(
        validate_pipeline(_shape_pipeline(tmp_path, {"rank": 32}, shape="sd3.5-medium", family="sd3"))
    )
    assert lora.footprint is not None
    frozen, trainable = lora.footprint.parameters - lora.footprint.trainable, lora.footprint.trainable
    assert lora.footprint.weight_bytes - (2 * frozen + 4 * trainable) == 2 * 384 * 384 * 1536


@pytest.mark.slow
def test_plan_prints_the_estimate_table_and_the_warning(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(_shape_pipeline(tmp_path, None)))
    command = [
        sys.executable,
        "-m",
        "flowpost.cli",
        "plan",
        str(path),
        "-w",
        str(tmp_path / "ws"),
        "--gpu-memory",
        "80",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "estimated memory per GPU" in done.stdout and "11.90 B" in done.stdout
    assert "warning: stages.grpo: about" in done.stdout and "over the 80 GiB" in done.stdout


def test_over_budget_names_each_stage_past_the_limit(tiny_pipeline, flux1_pipeline_dir: Path) -> None:
    model = {"family": "flux1", "pretrained": str(flux1_pipeline_dir), "options": OPTIONS["flux1"]}
    rows = stage_memory(validate_pipeline(_config(tiny_pipeline, model)))
    assert over_budget(rows, None) == [] and over_budget(rows, 1.0) == []
    [warning] = over_budget(rows, rows[0].estimate.total / 2 / 1024**3)
    assert warning.startswith("stages.sft: about")


def test_a_pipeline_that_cannot_be_read_here_gets_a_row_saying_why(tiny_pipeline) -> None:
    model = {"family": "flux1", "pretrained": "nobody/not-cached-here", "lora": {"rank": 4}}
    [row] = stage_memory(validate_pipeline(_config(tiny_pipeline, model)))  # HF_HUB_OFFLINE: no download
    assert row.estimate is None and row.note.startswith("not estimated:") and "transformer" in row.note
    assert over_budget([row], 1.0) == []


def test_the_vae_counts_in_fp32_unless_the_stage_never_encodes_or_decodes(tmp_path: Path) -> None:
    """SD3.5-Medium's VAE (AutoencoderKL, 83.8 M parameters) is held in fp32 by a GRPO stage, which decodes its
    samples for the reward; an SFT stage reading a latent cache, without validation grids, never loads it."""
    from flowpost.core.config.schema import StageConfig
    from flowpost.tasks.preflight import codec_bytes

    pipeline = validate_pipeline(_shape_pipeline(tmp_path, {"rank": 32}, shape="sd3.5-medium", family="sd3"))
    [grpo] = stage_memory(pipeline)
    assert grpo.estimate is not None and grpo.estimate.codec == 4 * 83_819_683
    model = pipeline.stages["grpo"].model
    cached = {
        "trainer": "sft",
        "model": model.model_dump(),
        "data": {"dataset": "d", "conditions": "c", "latents": "l"},
    }
    assert codec_bytes(StageConfig.model_validate(cached), model) == 0
    validated = {**cached, "callbacks": {"validation": {"every": 10, "prompts": ["a cat"]}}}
    assert codec_bytes(StageConfig.model_validate(validated), model) == grpo.estimate.codec
