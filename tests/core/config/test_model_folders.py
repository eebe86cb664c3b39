"""``flowpost validate`` checks every ``model:`` block naming a family before anything runs: its ``options``
against the family's, and a local ``pretrained`` folder's ``model_index.json`` and component configs (the
pipeline and transformer classes of the family, a flow-matching scheduler) without reading a weight."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_main import flowpost_main
from pretrained_stage import with_model

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.registry import adapter_class
from flowpost.errors import FlowpostError


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else 0) for p in root.rglob("*")}


def _copy(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "pipeline"
    shutil.copytree(folder, copy)
    return copy


def _set_scheduler(folder: Path, **config: Any) -> None:
    path = folder / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))


def _refused(config: dict[str, Any], *fragments: str) -> str:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(config)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize("command", ["validate", "plan", "run"])
def test_an_unknown_option_fails_every_command_before_anything_runs(
    tiny_pipeline, sd3_pipeline_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.chdir(tmp_path)
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "options": {"bogus": 1}}
    Path("pipeline.yaml").write_text(yaml.safe_dump(with_model(tiny_pipeline, model)))
    before = _tree(tmp_path)
    workspace = [] if command == "validate" else ["--workspace", "ws"]
    outcome = flowpost_main(command, "pipeline.yaml", *workspace)
    assert outcome.code == 1, outcome
    accepted = ", ".join(adapter_class("sd3").options) or "none"
    assert f"stages.sft.model.options: family 'sd3' has no option bogus; accepted: {accepted}" in outcome.stderr
    assert outcome.stderr.startswith("error: ") and "Traceback" not in outcome.stderr + outcome.stdout
    assert _tree(tmp_path) == before


def test_an_unknown_option_lists_the_accepted_ones(tiny_pipeline, flux1_pipeline_dir: Path) -> None:
    model = {"family": "flux1", "pretrained": str(flux1_pipeline_dir), "options": {"resolutoin": 16}}
    _refused(
        with_model(tiny_pipeline, model),
        "stages.sft.model.options: family 'flux1' has no option resolutoin; accepted: "
        + ", ".join(adapter_class("flux1").options),
    )


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (
            {"distilled_guidance": "high"},
            "stages.sft.model.options.distilled_guidance: distilled_guidance 'high' is a str; give a number",
        ),
        ({"resolution": True}, "stages.sft.model.options.resolution: resolution True is not a positive multiple of 16"),
        ({"resolution": 40}, "stages.sft.model.options.resolution: resolution 40 is not a positive multiple of 16"),
    ],
)
def test_an_option_value_the_family_rejects_names_its_path(
    tiny_pipeline, flux1_pipeline_dir: Path, options: dict[str, Any], fragment: str
) -> None:
    _refused(
        with_model(tiny_pipeline, {"family": "flux1", "pretrained": str(flux1_pipeline_dir), "options": options}),
        fragment,
    )


def test_a_latent_caches_options_are_checked_too(tiny_pipeline, sd3_pipeline_dir: Path) -> None:
    config = with_model(tiny_pipeline, {"family": "sd3", "pretrained": str(sd3_pipeline_dir)})
    codec = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "options": {"bogus": 1}}
    config["latents"] = {"lat": {"dataset": "shapes", "model": codec}}
    _refused(config, "latents.lat.model.options: family 'sd3' has no option bogus")


def test_a_family_that_does_not_match_the_folder_is_refused_through_the_cli(
    tiny_pipeline, sd3_pipeline_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = with_model(tiny_pipeline, {"family": "flux1", "pretrained": str(sd3_pipeline_dir)})
    Path("pipeline.yaml").write_text(yaml.safe_dump(config))
    outcome = flowpost_main("validate", "pipeline.yaml")
    assert outcome.code == 1 and "Traceback" not in outcome.stderr + outcome.stdout, outcome
    assert f"stages.sft.model.pretrained: {sd3_pipeline_dir} holds a StableDiffusion3Pipeline" in outcome.stderr
    assert "family 'flux1' loads a FluxPipeline" in outcome.stderr and "family: sd3" in outcome.stderr


def test_a_condition_caches_folder_is_checked_against_its_family(
    tiny_pipeline, sd3_pipeline_dir: Path, flux1_pipeline_dir: Path
) -> None:
    config = with_model(tiny_pipeline, {"family": "flux1", "pretrained": str(flux1_pipeline_dir)})
    config["conditions"]["own"]["model"]["pretrained"] = str(sd3_pipeline_dir)
    _refused(config, f"conditions.own.model.pretrained: {sd3_pipeline_dir} holds a StableDiffusion3Pipeline")
    config["conditions"]["spare"] = {"model": {"family": "flux9", "pretrained": "owner/name"}, "datasets": ["digits"]}
    _refused(config, "conditions.spare.model.family: unknown model family 'flux9'")


def test_a_transformer_of_another_family_is_refused(tiny_pipeline, sd3_pipeline_dir: Path, tmp_path: Path) -> None:
    folder = _copy(sd3_pipeline_dir, tmp_path)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(
        json.dumps({**index, "transformer": ["diffusers", "FluxTransformer2DModel"]})
    )
    _refused(
        with_model(tiny_pipeline, {"family": "sd3", "pretrained": str(folder)}),
        "stages.sft.model.pretrained:",
        "FluxTransformer2DModel",
        "SD3Transformer2DModel",
    )
    replaced = {"transformer": str(sd3_pipeline_dir / "vae")}  # a component folder of another class
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "components": replaced}
    _refused(with_model(tiny_pipeline, model), "stages.sft.model.components.transformer:", "AutoencoderKL")
    model["components"] = {"transfomer": str(sd3_pipeline_dir / "transformer")}
    _refused(with_model(tiny_pipeline, model), "stages.sft.model.components:", "'transfomer'")


def test_a_pretrained_path_that_is_no_pipeline_folder_is_named(
    tiny_pipeline, sd3_pipeline_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "empty").mkdir()
    cases = {
        str(tmp_path / "nowhere"): "does not exist",
        str(tmp_path / "a-file"): "is a file",
        str(tmp_path / "empty"): "holds no model_index.json",
        str(sd3_pipeline_dir / "transformer"): "holds no model_index.json",
    }
    for path, fragment in cases.items():
        message = _refused(with_model(tiny_pipeline, {"family": "sd3", "pretrained": path}), fragment)
        assert f"stages.sft.model.pretrained: {path} " in message and "Repo id" not in message
    validate_pipeline(with_model(tiny_pipeline, {"family": "sd3", "pretrained": "owner/hub-model"}))  # not offline


def test_a_scheduler_that_is_not_flow_matching_is_refused(
    tiny_pipeline, sd3_pipeline_dir: Path, tmp_path: Path
) -> None:
    folder = _copy(sd3_pipeline_dir, tmp_path)
    _set_scheduler(folder, _class_name="DDIMScheduler")
    _refused(
        with_model(tiny_pipeline, {"family": "sd3", "pretrained": str(folder)}),
        "stages.sft.model.pretrained:",
        "'DDIMScheduler'",
        str(folder / "scheduler"),
        "FlowMatchEulerDiscreteScheduler",
    )
    replaced = {"scheduler": str(folder / "scheduler")}  # the refusal holds for a replacing folder too
    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "components": replaced}
    _refused(with_model(tiny_pipeline, model), "stages.sft.model.components.scheduler:", "'DDIMScheduler'")


def test_wan2_takes_unipc_only_on_flow_sigmas(tiny_pipeline, wan2_pipeline_dir: Path, tmp_path: Path) -> None:
    folder = _copy(wan2_pipeline_dir, tmp_path)
    _set_scheduler(folder, _class_name="UniPCMultistepScheduler", use_flow_sigmas=False, flow_shift=3.0)
    config = with_model(tiny_pipeline, {"family": "wan2", "pretrained": str(folder)})
    _refused(config, "stages.sft.model.pretrained:", "UniPCMultistepScheduler", "use_flow_sigmas")
    _set_scheduler(folder, use_flow_sigmas=True)
    validate_pipeline(config)
    config["stages"]["sft"]["model"]["options"] = {"height": "480", "vae_tiling": "no"}
    _refused(
        config,
        "stages.sft.model.options.height: height '480' is a str; give an int",
        "stages.sft.model.options.vae_tiling: vae_tiling 'no' is a str; give true or false",
    )
    model = {"family": "sd3", "pretrained": str(_copy(wan2_pipeline_dir, tmp_path / "sd3"))}
    _refused(with_model(tiny_pipeline, model), "holds a WanPipeline")
