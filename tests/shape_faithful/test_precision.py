"""Each shape-faithful checkpoint trained as users train it, in bf16 weights under autocast: LoRA and full
fine-tuning keep fp32 trainable weights and Adam moments that lr 1e-5 moves, the replayed rollout's PPO ratio
stays 1, every Flow-SDE step of the family's own default grid is bounded, the VAE runs in fp32, and both
exports load into the stock pipeline at the published shape."""

from __future__ import annotations

import gc
import shutil
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flowpost.core.config.schema import StageConfig
from flowpost.core.diagnostics import check_consistency
from flowpost.core.io import write_json_atomic
from flowpost.core.models.footprint import attention_width
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.registry import adapter_class
from flowpost.core.sampling.checks import sde_step_problems
from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.condition_cache import update_condition_cache
from flowpost.data.records import Demonstration
from flowpost.data.shards import write_shards
from flowpost.stage import build_trainer
from shape_faithful.build import CHECKPOINTS, is_edit, published, seeded_edit_conditions, stock_pipeline

pytestmark = pytest.mark.shape

PROMPTS = ["a red cat", "a blue car"]
FINGERPRINT = "shape-faithful-encoders"
SIDE, FRAMES = 64, 5
OPTIONS: dict[str, dict[str, Any]] = {  # small latents: 128 px images, 64 x 64 x 5 video
    "sd3": {"resolution": 128},
    "flux1": {"resolution": 128},
    "flux1-kontext": {"resolution": 128},
    "qwen-image": {"resolution": 128},
    "wan2": {"height": SIDE, "width": SIDE, "num_frames": FRAMES},
    "wan22-a14b": {"height": SIDE, "width": SIDE, "num_frames": FRAMES},
    "z-image": {"resolution": 128},
    "flux2": {"resolution": 128},
    "flux2-klein": {"resolution": 128},
    "qwen-image-edit": {"resolution": 128},
    "qwen-image-edit-plus": {"resolution": 128},
}
MEDIA = {
    "sd3": (3, 128, 128),
    "flux1": (3, 128, 128),
    "flux1-kontext": (3, 128, 128),
    "qwen-image": (3, 128, 128),
    "wan2": (3, FRAMES, SIDE, SIDE),
    "wan22-a14b": (3, FRAMES, SIDE, SIDE),
    "z-image": (3, 128, 128),
    "flux2": (3, 128, 128),
    "flux2-klein": (3, 128, 128),
    "qwen-image-edit": (3, 128, 128),
    "qwen-image-edit-plus": (3, 128, 128),
}
DEFAULT_STEPS = {  # the stock num_inference_steps
    "sd3": 28,
    "flux1": 28,
    "flux1-kontext": 28,
    "qwen-image": 50,
    "wan2": 50,
    "wan22-a14b": 50,
    "z-image": 50,
    "flux2": 50,
    "flux2-klein": 50,
    "qwen-image-edit": 50,
    "qwen-image-edit-plus": 50,
}
EXPERTS = "wan22-a14b"  # the family whose network is two experts: LoRA on both, full fine-tuning of one
FULL_OPTIONS = {EXPERTS: {"experts": "high"}}  # one 5120-wide expert in fp32 with AdamW, as Z-Image's 3840-wide
# FLUX.2-dev's one-block transformer holds 2.2 B parameters: fp32 weights, gradients and AdamW moments would
# take 35 GB, past what this tier runs on; the edit checkpoints fine-tune Qwen-Image's transformer (the same
# config): their full fine-tuning rows would repeat Qwen-Image's
EDITS_OF_QWEN_IMAGE = ("qwen-image-edit", "qwen-image-edit-2509")
# FLUX.1-Kontext-dev's transformer is FLUX.1-dev's (same config, same linked weights here), whose rows train it
NOT_TRAINED = ("flux2-dev", "flux1-kontext-dev")
FULL_FINE_TUNED = [checkpoint for checkpoint in CHECKPOINTS if checkpoint not in (*NOT_TRAINED, *EDITS_OF_QWEN_IMAGE)]
# and its LoRA GRPO stage needs about 10 GB and longer than this whole tier's budget on a 2-core CPU: the dev
# folder is checked by the stock pipeline, the adapter's load and the SDE grid; klein carries the family's rows.
# Edit-Plus trains as Qwen-Image-Edit does on seeded conditions (another source count alone): Qwen-Image-Edit's
# row carries both
LORA_TRAINED = [checkpoint for checkpoint in CHECKPOINTS if checkpoint not in (*NOT_TRAINED, "qwen-image-edit-2509")]
LR = 1e-5


@pytest.fixture(autouse=True)
def _release() -> Iterator[None]:
    yield
    gc.collect()


def _prepared(root: Path, checkpoint: str, folder: Path) -> None:
    """Demonstrations of ``PROMPTS`` (random media at the stage's size) and their condition cache, encoded by
    the folder's own text encoders as the conditions node encodes them (an edit checkpoint's seeded:
    ``seeded_edit_conditions``)."""
    family = CHECKPOINTS[checkpoint].family
    rng = np.random.default_rng(0)
    records = [
        Demonstration(key=f"r{i}", prompt=prompt, image=rng.random(MEDIA[family], dtype=np.float32))
        for i, prompt in enumerate(PROMPTS)
    ]
    write_json_atomic(root / "data" / "train" / "manifest.json", write_shards(records, root / "data" / "train"))
    prompts = ["", *PROMPTS]
    if is_edit(checkpoint):
        encode = partial(seeded_edit_conditions, checkpoint)
        update_condition_cache(root / "conditions", prompts, encoder_fingerprint=FINGERPRINT, encode=encode)
        return
    encoder = adapter_class(family).prompt_encoder(PretrainedSource(str(folder)), max_length=128)
    try:
        update_condition_cache(root / "conditions", prompts, encoder_fingerprint=FINGERPRINT, encode=encoder.encode)
    finally:
        encoder.release()


def _spec(root: Path, name: str, stage: dict[str, Any]) -> StageSpec:
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    return StageSpec(
        stage=name,
        seed=0,
        config=StageConfig.model_validate(stage).model_dump(mode="json"),
        output_dir=str(out),
        dataset_dir=str(root / "data"),
        conditions_dir=str(root / "conditions"),
        encoder_fingerprint=FINGERPRINT,
        resume=False,
    )


def _model(family: str, folder: Path, **extra: Any) -> dict[str, Any]:
    return {"family": family, "pretrained": str(folder), "torch_dtype": "bfloat16", "options": OPTIONS[family], **extra}


def _fraction_changed(before: dict[str, torch.Tensor], network: torch.nn.Module) -> float:
    now = dict(network.named_parameters())
    changed = sum(int((now[name].detach().float() != value).sum()) for name, value in before.items())
    return changed / sum(value.numel() for value in before.values())


@pytest.fixture
def prepared(request: pytest.FixtureRequest, shape_folder: Callable[[str], Path], tmp_path: Path) -> dict[str, Any]:
    """The checkpoint the test is parametrized with (``indirect``): its folder, data and condition cache."""
    checkpoint = request.param
    family, folder = CHECKPOINTS[checkpoint].family, shape_folder(checkpoint)
    _prepared(tmp_path, checkpoint, folder)
    return {"checkpoint": checkpoint, "family": family, "folder": folder, "root": tmp_path}


@pytest.mark.parametrize("checkpoint", list(CHECKPOINTS))
def test_every_sde_step_of_the_default_grid_is_bounded(checkpoint: str, shape_folder: Callable[[str], Path]) -> None:
    family, folder = CHECKPOINTS[checkpoint].family, shape_folder(checkpoint)
    adapter = adapter_class(family).without_weights(PretrainedSource(str(folder), torch_dtype="bfloat16"))
    steps = DEFAULT_STEPS[family]
    sigmas = adapter.inference_sigmas(steps)
    assert sde_step_problems(sigmas, SamplingConfig(steps=steps), needs_noise=True) == []


@pytest.mark.parametrize("prepared", LORA_TRAINED, indirect=True)
def test_lora_grpo_in_bf16_replays_exactly_moves_fp32_adapters_and_exports(prepared: dict[str, Any]) -> None:
    family, folder, root = prepared["family"], prepared["folder"], prepared["root"]
    stage = {
        "trainer": "grpo",
        "model": _model(family, folder, lora={"rank": 4, "alpha": 8}),
        "sampling": {"steps": 3, "guidance": 1.0},
        "rewards": [{"name": "jpeg_incompressibility", **({"frames": "first"} if family in ("wan2", EXPERTS) else {})}],
        "train": {
            "lr": LR,
            "iterations": 3,
            "prompts_per_iteration": 1,
            "group_size": 2,
            "rollout_batch_size": 2,
            "train_batch_size": 2,
            "checkpoint_every": 0,
        },
    }
    trainer = build_trainer(_spec(root, "grpo", stage))
    adapter, network = trainer.adapter, trainer.adapter.module()
    assert adapter.compute_dtype == torch.bfloat16
    assert {p.dtype for p in trainer.trainable} == {torch.float32}
    frozen = [p for p in network.parameters() if not p.requires_grad]
    half = sum(p.numel() for p in frozen if p.dtype == torch.bfloat16)  # but the modules diffusers keeps in fp32
    assert half > 0.9 * sum(p.numel() for p in frozen)
    assert {p.dtype for p in adapter.vae.parameters()} == {torch.float32}
    report = check_consistency(trainer)
    # bf16 kernels may round the rollout's and the replay's passes apart (0 to 1.4e-5 measured here); below
    # Flow-GRPO's clip range (1e-4) the replay never clips on rounding alone
    assert report["max_abs_ratio_error"] < 1e-4, report
    lora_a = {n: p.detach().float().clone() for n, p in network.named_parameters() if "lora_A" in n}
    trainer.start()
    moments = [m for s in trainer.optimizer.optimizer.state.values() for m in (s["exp_avg"], s["exp_avg_sq"])]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    assert _fraction_changed(lora_a, network) > 0.5

    export = root / "export"
    adapter.save_pretrained(export)
    pipeline = stock_pipeline(prepared["checkpoint"], folder)
    from peft.utils import get_peft_model_state_dict

    experts = [("transformer", "lora", network, {})]  # pipeline component, LoRA folder, trained network, load options
    if family == EXPERTS:
        second = ("transformer_2", "lora_2", network.low, {"load_into_transformer_2": True})
        experts = [("transformer", "lora", network.high, {}), second]
    for component, lora, trained_network, options in experts:
        pipeline.load_lora_weights(export / lora, **options)
        [name] = getattr(pipeline, component).peft_config  # the adapter load_lora_weights named
        loaded = get_peft_model_state_dict(getattr(pipeline, component), adapter_name=name)
        trained = get_peft_model_state_dict(trained_network)
        assert loaded.keys() == trained.keys() and loaded
        for key, value in trained.items():
            torch.testing.assert_close(loaded[key].float(), value.float().to(loaded[key].dtype).float(), msg=key)


def test_lora_grpo_over_an_int8_base_replays_exactly_at_sd3_width(
    shape_folder: Callable[[str], Path], tmp_path: Path
) -> None:
    """SD3.5-Medium's block at its published width, its Linear weights int8 under bf16 autocast."""
    from flowpost.core.models.quantize import is_quantized

    folder = shape_folder("sd3.5-medium")
    _prepared(tmp_path, "sd3.5-medium", folder)
    stage = {
        "trainer": "grpo",
        "model": _model("sd3", folder, lora={"rank": 4, "alpha": 8}, quantize="int8"),
        "sampling": {"steps": 3, "guidance": 1.0},
        "rewards": [{"name": "jpeg_incompressibility"}],
        "train": {
            "lr": LR,
            "iterations": 1,
            "prompts_per_iteration": 1,
            "group_size": 2,
            "rollout_batch_size": 2,
            "train_batch_size": 2,
            "checkpoint_every": 0,
        },
    }
    trainer = build_trainer(_spec(tmp_path, "grpo", stage))
    network = trainer.adapter.module()
    quantized = [p for p in network.parameters() if is_quantized(p)]
    assert quantized and {p.qdata.dtype for p in quantized} == {torch.int8}
    assert {p.dtype for p in trainer.trainable} == {torch.float32}
    report = check_consistency(trainer)
    assert report["max_abs_ratio_error"] < 1e-4, report  # the bf16 tolerance of the test above
    lora_b = {n: p.detach().float().clone() for n, p in network.named_parameters() if "lora_B" in n}
    trainer.start()
    assert _fraction_changed(lora_b, network) > 0.5  # B starts at 0, so the first update moves B alone


@pytest.mark.parametrize("prepared", FULL_FINE_TUNED, indirect=True)
def test_full_fine_tuning_in_bf16_keeps_fp32_master_weights_and_exports(prepared: dict[str, Any]) -> None:
    family, folder, root = prepared["family"], prepared["folder"], prepared["root"]
    options = {**OPTIONS[family], **FULL_OPTIONS.get(family, {})}
    stage = {
        "trainer": "sft",
        "model": {**_model(family, folder), "options": options},
        "train": {"lr": LR, "batch_size": 2, "max_steps": 1, "checkpoint_every": 0},
    }
    trainer = build_trainer(_spec(root, "sft", stage))
    network = trainer.adapter.module()
    trained = network.high if family == EXPERTS else network  # the expert that trains; the other stays bf16
    assert {p.dtype for p in trained.parameters()} == {torch.float32} and all(
        p.requires_grad for p in trained.parameters()
    )
    if family == EXPERTS:  # frozen as loaded: bf16 but the modules diffusers keeps in fp32
        low = list(network.low.parameters())
        assert not any(p.requires_grad for p in low)
        assert sum(p.numel() for p in low if p.dtype == torch.bfloat16) > 0.9 * sum(p.numel() for p in low)
    assert trainer.adapter.compute_dtype == torch.bfloat16
    blocks = {n: p.detach().clone() for n, p in trained.named_parameters() if ".to_q." in n}
    trainer.start()
    assert _fraction_changed(blocks, trained) > 0.5  # bf16 weights would round nearly every update away

    export = root / "export"
    trainer.adapter.save_pretrained(export)
    import diffusers

    transformer_class = getattr(diffusers, published(prepared["checkpoint"], "model_index")["transformer"][1])
    transformer = transformer_class.from_pretrained(export / "transformer", torch_dtype=torch.bfloat16)
    pipeline = stock_pipeline(prepared["checkpoint"], folder, transformer=transformer)
    assert attention_width(pipeline.transformer.config) == attention_width(
        published(prepared["checkpoint"], "transformer")
    )
    name = next(n for n in blocks)
    torch.testing.assert_close(
        dict(pipeline.transformer.named_parameters())[name].float(),
        dict(trained.named_parameters())[name].detach().to(torch.bfloat16).float(),
    )
