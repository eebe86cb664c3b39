"""What every family loaded from a diffusers pipeline folder does alike (sd3, flux1, flux2, qwen-image, z-image)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_flux1_pipeline import load_flux1_adapter
from tiny_flux2_pipeline import load_flux2_adapter, load_flux2_klein_adapter
from tiny_qwen_image_pipeline import load_qwen_image_adapter
from tiny_sd3_pipeline import load_sd3_adapter
from tiny_z_image_pipeline import load_z_image_adapter

from flowpost.core.models.pipeline_family import PipelineFamily
from flowpost.errors import FlowpostError

PROMPTS = ["a red cat", "a blue dog on a car"]
LOADERS = {
    "sd3": (load_sd3_adapter, "sd3_pipeline_dir"),
    "flux1": (load_flux1_adapter, "flux1_pipeline_dir"),
    "qwen-image": (load_qwen_image_adapter, "qwen_image_pipeline_dir"),
    "z-image": (load_z_image_adapter, "z_image_pipeline_dir"),
    "flux2": (load_flux2_adapter, "flux2_pipeline_dir"),
    "flux2-klein": (load_flux2_klein_adapter, "flux2_klein_pipeline_dir"),
}


@pytest.fixture(params=sorted(LOADERS))
def load(request: pytest.FixtureRequest) -> Any:
    """``load(**source_options)``: the family's tiny pipeline folder through the registry."""
    loader, folder = LOADERS[request.param]
    return lambda **options: loader(request.getfixturevalue(folder), **options)


def _velocity(adapter: PipelineFamily, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    noise = torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(0))
    state = adapter.prepare_condition_state(adapter.encode_conditions(PROMPTS))
    return adapter.velocity(noise.to(dtype), torch.tensor(0.5), state)


def test_gradient_checkpointing_gives_the_same_gradients(load: Any) -> None:
    grads = []
    for enabled in (False, True):
        adapter = load()
        adapter.module().train()
        adapter.set_gradient_checkpointing(enabled)
        assert adapter.module().is_gradient_checkpointing is enabled
        _velocity(adapter).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in adapter.module().parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-6)


def test_torch_dtype_reaches_the_weights_and_the_velocity(load: Any) -> None:
    adapter = load(torch_dtype="bfloat16")
    assert next(adapter.module().parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        assert _velocity(adapter, torch.bfloat16).dtype == torch.bfloat16


def test_vae_round_trip_shapes(load: Any) -> None:
    adapter = load()
    media = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        latents = adapter.encode_output_state(media)
        images = adapter.decode(latents)
    assert latents.shape == (3, *adapter.latent_shape) and latents.dtype == media.dtype
    assert images.shape == media.shape and 0.0 <= float(images.min()) <= float(images.max()) <= 1.0


@pytest.mark.parametrize(
    ("family", "component"),
    [
        *[("sd3", c) for c in ("transformer", "vae", "text_encoder_3")],
        *[("flux1", c) for c in ("transformer", "scheduler", "vae", "text_encoder_2")],
        *[("qwen-image", c) for c in ("transformer", "vae", "text_encoder", "tokenizer")],
        *[("z-image", c) for c in ("transformer", "scheduler", "vae", "text_encoder", "tokenizer")],
        *[("flux2", c) for c in ("transformer", "vae", "text_encoder", "tokenizer")],
    ],
)
def test_a_missing_component_names_itself_and_the_folder(
    request: pytest.FixtureRequest, tmp_path: Path, family: str, component: str
) -> None:
    loader, fixture = LOADERS[family]
    folder = tmp_path / "broken"
    shutil.copytree(request.getfixturevalue(fixture), folder, ignore=shutil.ignore_patterns(component))
    with pytest.raises(FlowpostError) as info:  # the transformer (and scheduler) load first, the rest on use
        adapter = loader(folder)
        adapter.decode(torch.randn(len(PROMPTS), *adapter.latent_shape, generator=torch.Generator().manual_seed(0)))
        adapter.encode_conditions(PROMPTS)
    assert f"{component!r}" in str(info.value) and str(folder) in str(info.value)


def _same_weights(module: torch.nn.Module, other: torch.nn.Module) -> bool:
    mine, theirs = module.state_dict(), other.state_dict()
    return mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_component_folders_replace_the_pipelines_own(load: Any, tmp_path: Path) -> None:
    tuned = load()
    with torch.no_grad():
        for param in tuned.module().parameters():
            param.add_(0.01)
    tuned.module().save_pretrained(tmp_path / "transformer")
    vae = load().vae
    with torch.no_grad():
        for param in vae.parameters():
            param.mul_(1.1)
    vae.save_pretrained(tmp_path / "vae")
    adapter = load(components={"transformer": str(tmp_path / "transformer"), "vae": str(tmp_path / "vae")})
    assert _same_weights(adapter.module(), tuned.module()) and _same_weights(adapter.vae, vae)
    assert not _same_weights(adapter.module(), load().module())
    adapter.save_pipeline(tmp_path / "export")  # the exported pipeline holds the replacing VAE
    assert _same_weights(type(vae).from_pretrained(tmp_path / "export" / "vae"), vae)
    assert adapter.source.fingerprint() != load().source.fingerprint()


def test_a_missing_or_mismatched_component_folder_names_it_and_the_folder(load: Any, tmp_path: Path) -> None:
    folder = Path(load().source.path)
    with pytest.raises(FlowpostError, match=r"'transformer' component does not exist") as missing:
        load(components={"transformer": str(tmp_path / "nowhere")})
    assert str(tmp_path / "nowhere") in str(missing.value)
    with pytest.raises(FlowpostError, match=r"'transformer' component holds a AutoencoderKL\w*, but") as mismatched:
        load(components={"transformer": str(folder / "vae")})
    assert str(folder / "vae") in str(mismatched.value) and "model.components.transformer" in str(mismatched.value)
    with pytest.raises(FlowpostError, match=r"model\.components names 'transfomer'.*its components: .*transformer"):
        load(components={"transfomer": str(folder / "transformer")})


def test_a_model_index_naming_another_module_is_refused_without_importing_it(
    sd3_pipeline_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    folder = tmp_path / "pipeline"
    shutil.copytree(sd3_pipeline_dir, folder)
    marker = tmp_path / "imported"
    (tmp_path / "planted.py").write_text(f"open({str(marker)!r}, 'w').close()\nAutoencoderKL = object\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    index_path = folder / "model_index.json"
    index = json.loads(index_path.read_text())
    index["vae"] = ["planted", "AutoencoderKL"]
    index_path.write_text(json.dumps(index))
    refused = r"names planted\.AutoencoderKL for component 'vae'; components load only from diffusers or transformers"
    with pytest.raises(FlowpostError, match=refused):  # a component replaced: checked as it loads
        load_sd3_adapter(folder, components={"vae": str(sd3_pipeline_dir / "vae")})
    with pytest.raises(FlowpostError, match=refused):  # none replaced: checked before the export loads the rest
        load_sd3_adapter(folder).save_pipeline(tmp_path / "export")
    assert not marker.exists() and not (tmp_path / "export").exists()

    index["vae"] = ["diffusers", "AutoencoderKLNowhere"]
    index_path.write_text(json.dumps(index))
    replaced = load_sd3_adapter(folder, components={"vae": str(sd3_pipeline_dir / "vae")})
    with pytest.raises(FlowpostError, match=r"diffusers\.AutoencoderKLNowhere .*which diffusers does not have"):
        replaced.save_pipeline(tmp_path / "export")


def test_a_scheduler_of_another_kind_is_refused_at_load_not_sampled_as_flow_matching(
    sd3_pipeline_dir: Path, tmp_path: Path
) -> None:
    import json

    folder = tmp_path / "pipeline"
    shutil.copytree(sd3_pipeline_dir, folder)
    config = folder / "scheduler" / "scheduler_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "_class_name": "DDIMScheduler"}))
    with pytest.raises(
        FlowpostError,
        match="its scheduler is 'DDIMScheduler'; family 'sd3' samples on the sigmas of FlowMatchEulerDiscreteScheduler",
    ) as refused:
        load_sd3_adapter(folder)
    assert refused.value.where == f"{folder}/scheduler"
