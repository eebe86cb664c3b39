"""The diffusers release every family needs: declared in the package's requirements and checked at load."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import diffusers
import pytest

from flowpost.core.models.pipeline_family import DIFFUSERS_FLOOR
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.qwen_image import QwenImageAdapter
from flowpost.core.models.registry import FAMILIES, adapter_class
from flowpost.errors import FlowpostError

PYPROJECT = Path(__file__).parents[3] / "pyproject.toml"
# The first release of each class the families load as flowpost calls them: QwenImageTransformer2DModel
# ships in 0.35, but its forward takes the text length from the mask (no ``txt_seq_lens``) from 0.37.
FIRST_RELEASE = {"QwenImageTransformer2DModel": (0, 37), "QwenImagePipeline": (0, 35), "WanPipeline": (0, 33)}


def _minor(version: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def test_the_declared_floor_has_every_family_class() -> None:
    requirements = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (floor,) = [r.removeprefix("diffusers>=") for r in requirements if r.startswith("diffusers")]
    assert _minor(floor) == _minor(DIFFUSERS_FLOOR) >= max(FIRST_RELEASE.values())
    families = [adapter_class(name) for name in FAMILIES if name != "tiny-sd3"]
    names = {name for family in families for name in (family.transformer_class, family.pipeline_class)}
    assert set(FIRST_RELEASE) <= names and all(hasattr(diffusers, name) for name in names)


def test_an_older_diffusers_names_the_family_and_the_release(
    qwen_image_pipeline_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(diffusers, "__version__", "0.36.1")
    with pytest.raises(FlowpostError, match=r"qwen-image needs diffusers >= 0\.37.* 0\.36\.1") as error:
        QwenImageAdapter.without_weights(PretrainedSource(str(qwen_image_pipeline_dir)))
    assert error.value.where == "model.family"


def test_a_missing_family_class_names_the_family_and_the_release(
    qwen_image_pipeline_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(QwenImageAdapter, "transformer_class", "QwenImageTransformer9DModel")
    with pytest.raises(FlowpostError, match=r"QwenImageTransformer9DModel.*qwen-image needs diffusers >= 0\.37"):
        QwenImageAdapter.without_weights(PretrainedSource(str(qwen_image_pipeline_dir)))
