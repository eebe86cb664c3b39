"""The ``kohya`` export format: ``lora_kohya.safetensors`` loads into the stock pipeline through diffusers' own
conversion and generates what the diffusers-format ``lora/`` does; a family, stage or target it cannot write is
refused when the pipeline is validated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pretrained_stage import with_model
from tiny_flux1_kontext_pipeline import RESOLUTION as KONTEXT_RESOLUTION
from tiny_flux1_kontext_pipeline import load_flux1_kontext_adapter, seeded_kontext_latents
from tiny_flux1_pipeline import RESOLUTION as FLUX1_RESOLUTION
from tiny_flux1_pipeline import load_flux1_adapter
from tiny_qwen_image_pipeline import MAX_LENGTH as QWEN_IMAGE_MAX_LENGTH
from tiny_qwen_image_pipeline import RESOLUTION as QWEN_IMAGE_RESOLUTION
from tiny_qwen_image_pipeline import load_qwen_image_adapter
from tiny_sd3_pipeline import T5_LENGTH

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.io import write_json_atomic
from flowpost.core.models.transformer_adapter import TransformerAdapter
from flowpost.errors import FlowpostError
from flowpost.tasks.export import KOHYA_LORA_FILE, export_stage

PROMPTS = ["a red cat", "a blue dog on a car"]
RANK, ALPHA = 2, 6.0  # alpha != rank: the scale must travel in the file
# Every block module but a single block's linear1 parts, whose split diffusers' conversion hard-codes at FLUX.1's
# width (3072; tests/shape_faithful/test_kohya_lora.py covers it); to_v left out: a fused part written as zeros.
FLUX1_TARGETS = [
    "transformer_blocks.0.attn.to_q",
    "transformer_blocks.0.attn.to_k",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_out.0",
    "to_add_out",
    "ff.net.0.proj",
    "ff.net.2",
    "ff_context.net.0.proj",
    "ff_context.net.2",
    "norm1.linear",
    "norm1_context.linear",
    "single_transformer_blocks.0.proj_out",
    "norm.linear",
]


def _trained_export(adapter: TransformerAdapter, out: Path, targets: list[str] | None) -> Path:
    """``adapter`` with perturbed LoRA (nonzero ups, as after training), exported as diffusers and kohya."""
    adapter.add_lora(rank=RANK, alpha=ALPHA, targets=targets)
    with torch.no_grad():
        for name, param in adapter.module().named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    train_dir = out / "train"
    adapter.save_pretrained(train_dir / "final" / "live")
    write_json_atomic(train_dir / "final" / "progress.json", {"optimizer_step": 7})
    (out / "export").mkdir()
    export_stage(
        stage="s",
        train_dir=train_dir,
        out_dir=out / "export",
        weights="live",
        resolved_config={"name": "kohya-export"},
        fingerprints={},
        formats=("diffusers", "kohya"),
    )
    return out / "export"


@pytest.fixture(scope="module")
def flux1_kohya(flux1_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    adapter = load_flux1_adapter(flux1_pipeline_dir)
    return adapter, _trained_export(adapter, tmp_path_factory.mktemp("flux1-kohya"), FLUX1_TARGETS)


@pytest.fixture(scope="module")
def flux1_kontext_kohya(flux1_kontext_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    adapter = load_flux1_kontext_adapter(flux1_kontext_pipeline_dir)
    return adapter, _trained_export(adapter, tmp_path_factory.mktemp("flux1-kontext-kohya"), FLUX1_TARGETS)


@pytest.fixture(scope="module")
def qwen_image_kohya(qwen_image_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    adapter = load_qwen_image_adapter(qwen_image_pipeline_dir)
    return adapter, _trained_export(adapter, tmp_path_factory.mktemp("qwen-image-kohya"), None)


SAMPLING: dict[str, dict[str, Any]] = {  # the stock pipeline's call: 4 steps at the tiny folders' size
    "flux1": {"max_sequence_length": T5_LENGTH, "height": FLUX1_RESOLUTION, "width": FLUX1_RESOLUTION},
    "flux1-kontext": {  # seeded source latents, which the pipeline packs as given
        "max_sequence_length": T5_LENGTH,
        "height": KONTEXT_RESOLUTION,
        "width": KONTEXT_RESOLUTION,
        "max_area": KONTEXT_RESOLUTION**2,
        "image": seeded_kontext_latents(PROMPTS),
    },
    "qwen-image": {
        "max_sequence_length": QWEN_IMAGE_MAX_LENGTH,
        "height": QWEN_IMAGE_RESOLUTION,
        "width": QWEN_IMAGE_RESOLUTION,
        "true_cfg_scale": 4.0,
        "negative_prompt": [""] * len(PROMPTS),
    },
}


@pytest.mark.parametrize(
    ("family", "exported", "folder", "pipeline_class"),
    [
        ("flux1", "flux1_kohya", "flux1_pipeline_dir", "FluxPipeline"),
        ("flux1-kontext", "flux1_kontext_kohya", "flux1_kontext_pipeline_dir", "FluxKontextPipeline"),
        ("qwen-image", "qwen_image_kohya", "qwen_image_pipeline_dir", "QwenImagePipeline"),
    ],
)
def test_the_kohya_file_generates_in_the_stock_pipeline_what_the_diffusers_lora_does(
    request: pytest.FixtureRequest, family: str, exported: str, folder: str, pipeline_class: str
) -> None:
    import diffusers

    adapter, export = request.getfixturevalue(exported)
    pretrained = request.getfixturevalue(folder)
    noise = torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(0))

    def latents(lora: Path | None) -> torch.Tensor:
        pipe = getattr(diffusers, pipeline_class).from_pretrained(pretrained)
        if lora is not None:
            pipe.load_lora_weights(lora)
        options = {"num_inference_steps": 4, "output_type": "latent", **SAMPLING[family]}
        return pipe(prompt=PROMPTS, latents=noise.clone(), **options).images

    expected = latents(export / "lora")
    torch.testing.assert_close(latents(export / KOHYA_LORA_FILE), expected, rtol=0, atol=1e-5)
    assert not torch.allclose(latents(None), expected, atol=1e-3)  # the LoRA changed what is generated


def test_flux1_modules_take_their_original_names_with_fused_projections(flux1_kohya) -> None:
    from safetensors import safe_open

    _, export = flux1_kohya
    with safe_open(export / KOHYA_LORA_FILE, "pt") as file:
        header = file.metadata()
        tensors = {key: file.get_tensor(key) for key in file.keys()}
    modules = {key.split(".")[0] for key in tensors}
    double = [f"double_blocks_0_img_{m}" for m in ("attn_qkv", "attn_proj", "mlp_0", "mlp_2", "mod_lin")]
    double += [name.replace("img", "txt") for name in double]
    assert modules == {f"lora_unet_{m}" for m in [*double, "single_blocks_0_linear2", "single_blocks_0_modulation_lin"]}
    qkv = "lora_unet_double_blocks_0_img_attn_qkv"  # q and k trained, v zeros: rank 3 * 2, alpha 3 * 6
    down, up = tensors[f"{qkv}.lora_down.weight"], tensors[f"{qkv}.lora_up.weight"]
    assert down.shape == (3 * RANK, 16) and up.shape == (3 * 16, 3 * RANK)
    assert tensors[f"{qkv}.alpha"].item() == 3 * ALPHA
    assert down[2 * RANK :].abs().sum() == 0 and up[2 * 16 :].abs().sum() == 0 and up[:16, RANK:].abs().sum() == 0
    assert tensors["lora_unet_double_blocks_0_img_attn_proj.alpha"].item() == ALPHA
    assert header["ss_network_module"] == "networks.lora_flux" and header["ss_network_dim"] == str(RANK)
    assert (header["flowpost.stage"], header["flowpost.step"]) == ("s", "7")
    assert KOHYA_LORA_FILE in (export / "README.md").read_text()


def _export_refused(config: dict[str, Any], *fragments: str) -> None:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(config)
    for fragment in ("export.formats", *fragments):
        assert fragment in str(info.value), str(info.value)


def test_a_family_diffusers_loads_no_kohya_file_of_is_refused(tiny_pipeline) -> None:
    config = tiny_pipeline()
    config["export"]["formats"] = ["diffusers", "kohya"]
    _export_refused(config, "families flux1, flux1-kontext, qwen-image", "'tiny-sd3'")


def _flux1_kohya(tiny_pipeline, folder: Path, **model: Any) -> dict[str, Any]:
    config = with_model(tiny_pipeline, {"family": "flux1", "pretrained": str(folder), **model})
    config["export"]["formats"] = ["kohya"]
    return config


def test_a_flux1_stage_kohya_cannot_write_is_refused(tiny_pipeline, flux1_pipeline_dir: Path) -> None:
    _export_refused(_flux1_kohya(tiny_pipeline, flux1_pipeline_dir), "trains every weight", "stages.sft.model.lora")
    lora = {"rank": 4, "targets": ["to_q", "proj_out", "x_embedder"]}
    config = _flux1_kohya(tiny_pipeline, flux1_pipeline_dir, lora=lora)
    _export_refused(config, "'proj_out', 'x_embedder'", "stages.sft.model.lora.targets")
    config = _flux1_kohya(tiny_pipeline, flux1_pipeline_dir, lora={"rank": 4})  # the family's attention: in blocks
    assert validate_pipeline(config).export.formats == ["kohya"]
