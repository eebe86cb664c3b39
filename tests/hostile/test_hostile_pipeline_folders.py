"""Hostile pipeline folders: ``flowpost validate`` opens each local folder's ``model_index.json`` and component
configs (no weights) and refuses what would fail later, naming the dotted path, without a traceback and
without writing anything."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostile_cli import refused
from pretrained_stage import with_model

FAMILIES = {"sd3": "sd3_pipeline_dir", "flux1": "flux1_pipeline_dir", "wan2": "wan2_pipeline_dir"}
OTHER = {"sd3": "flux1", "flux1": "wan2", "wan2": "sd3"}  # a family whose classes the folder does not hold
BAD_VALUE = {"sd3": ("resolution", "512"), "flux1": ("resolution", "512"), "wan2": ("height", "480")}


def _edit_json(path: Path, **changes: Any) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _index(folder: Path) -> Path:
    return folder / "model_index.json"


# name -> (defect applied to a copy of the family's folder, the model block's changes, what the error names)
Defect = Callable[[Path, str], None]
DEFECTS: dict[str, tuple[Defect, Callable[[str, Path], dict], str]] = {
    "missing-folder": (lambda f, fam: shutil.rmtree(f), lambda fam, f: {}, "stages.sft.model.pretrained"),
    "a-file": (
        lambda f, fam: (shutil.rmtree(f), f.write_text("not a folder\n")),
        lambda fam, f: {},
        "stages.sft.model.pretrained",
    ),
    "no-model-index": (lambda f, fam: _index(f).unlink(), lambda fam, f: {}, "model_index.json"),
    "model-index-not-json": (lambda f, fam: _index(f).write_text("{oops"), lambda fam, f: {}, "model_index.json"),
    "model-index-a-list": (lambda f, fam: _index(f).write_text("[]"), lambda fam, f: {}, "model_index.json"),
    "another-pipeline-class": (
        lambda f, fam: _edit_json(_index(f), _class_name="StableDiffusionXLPipeline"),
        lambda fam, f: {},
        "StableDiffusionXLPipeline",
    ),
    "another-transformer-class": (
        lambda f, fam: _edit_json(_index(f), transformer=["diffusers", "UNet2DConditionModel"]),
        lambda fam, f: {},
        "UNet2DConditionModel",
    ),
    "ddim-scheduler": (
        lambda f, fam: _edit_json(f / "scheduler" / "scheduler_config.json", _class_name="DDIMScheduler"),
        lambda fam, f: {},
        "DDIMScheduler",
    ),
    "unknown-scheduler": (
        lambda f, fam: _edit_json(f / "scheduler" / "scheduler_config.json", _class_name="MySampler"),
        lambda fam, f: {},
        "MySampler",
    ),
    "no-vae": (lambda f, fam: shutil.rmtree(f / "vae"), lambda fam, f: {}, "vae"),
    "no-scheduler": (lambda f, fam: shutil.rmtree(f / "scheduler"), lambda fam, f: {}, "scheduler"),
    "no-transformer": (lambda f, fam: shutil.rmtree(f / "transformer"), lambda fam, f: {}, "transformer"),
    "planted-module": (
        lambda f, fam: _edit_json(_index(f), vae=["planted", "AutoencoderKL"]),
        lambda fam, f: {},
        "planted",
    ),
    "bogus-option": (lambda f, fam: None, lambda fam, f: {"options": {"bogus": 1}}, "stages.sft.model.options"),
    "option-of-another-type": (
        lambda f, fam: None,
        lambda fam, f: {"options": {BAD_VALUE[fam][0]: BAD_VALUE[fam][1]}},
        "stages.sft.model.options",
    ),
    "another-family": (lambda f, fam: None, lambda fam, f: {"family": OTHER[fam]}, "stages.sft.model"),
    "component-folder-missing": (
        lambda f, fam: None,
        lambda fam, f: {"components": {"vae": str(f.parent / "nowhere")}},
        "stages.sft.model.components",
    ),
    "component-not-in-index": (
        lambda f, fam: None,
        lambda fam, f: {"components": {"vea": str(f / "vae")}},
        "stages.sft.model.components",
    ),
    "component-of-another-class": (
        lambda f, fam: None,
        lambda fam, f: {"components": {"transformer": str(f / "vae")}},
        "stages.sft.model.components",
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_a_hostile_pipeline_folder_is_refused_by_validate(
    tiny_pipeline,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    family: str,
    defect: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "pipeline"
    shutil.copytree(request.getfixturevalue(FAMILIES[family]), folder)
    damage, model_changes, says = DEFECTS[defect]
    damage(folder, family)
    model = {"family": family, "pretrained": str(folder), **model_changes(family, folder)}
    config = with_model(tiny_pipeline, model)
    config["conditions"]["own"]["model"]["family"] = family  # the cache's encoders stay the folder's own family
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    for command in (["validate", "pipeline.yaml"], ["plan", "pipeline.yaml", "--workspace", "ws"]):
        refused(*command, naming=says)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
