"""The codec fingerprint a latent cache records: it follows the VAE's files, not the transformer's."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from tiny_sd3_pipeline import VAE

from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.registry import adapter_class
from flowpost.core.models.tiny_sd3 import TinySD3Adapter


def _fingerprint(pipeline: Path, **components: Path) -> str:
    source = PretrainedSource(str(pipeline), components={name: str(path) for name, path in components.items()})
    return adapter_class("sd3").from_pipeline(source).codec_fingerprint()


def test_the_fingerprint_changes_with_the_vae_weights_only(sd3_pipeline_dir: Path, tmp_path: Path) -> None:
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    stock = _fingerprint(sd3_pipeline_dir)
    shutil.copytree(sd3_pipeline_dir / "vae", tmp_path / "same-vae")
    transformer = SD3Transformer2DModel.from_pretrained(sd3_pipeline_dir / "transformer")
    with torch.no_grad():
        next(transformer.parameters()).add_(1.0)
    transformer.save_pretrained(tmp_path / "transformer")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        AutoencoderKL(**VAE).save_pretrained(tmp_path / "other-vae")
    assert _fingerprint(sd3_pipeline_dir, vae=tmp_path / "same-vae") == stock
    assert _fingerprint(sd3_pipeline_dir, transformer=tmp_path / "transformer") == stock
    assert _fingerprint(sd3_pipeline_dir, vae=tmp_path / "other-vae") != stock
    assert TinySD3Adapter.from_scratch(seed=0).codec_fingerprint() not in (stock, "")
    assert (
        TinySD3Adapter.from_scratch(seed=1).codec_fingerprint()
        == TinySD3Adapter.from_scratch(seed=0).codec_fingerprint()
    )
