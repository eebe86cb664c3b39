"""Node ``latents.<name>``: encode a dataset's media once with a model family's output codec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flowpost.core.config.schema.captioned import CaptionedDataset
from flowpost.core.config.schema.datasets import DatasetConfig
from flowpost.core.config.schema.models import CodecModelConfig, LatentsConfig
from flowpost.core.models.base import ModelAdapter
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.registry import adapter_class
from flowpost.data.latent_cache import write_latent_cache
from flowpost.stage import pipeline_adapter


def cache_latents(
    config: LatentsConfig, dataset: DatasetConfig, dataset_dir: Path, out_dir: Path, *, where: str
) -> dict[str, Any]:
    """Encode the training records of ``dataset_dir`` into ``out_dir`` (on cuda when present, as stages train);
    ``where`` is the config path of the cache (``latents.<name>``)."""
    adapter = codec_adapter(config.model, where=where)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    manifest = write_latent_cache(
        Path(dataset_dir) / "train",
        out_dir,
        encode=adapter.encode_output_state,
        codec_fingerprint=adapter.codec_fingerprint(),
        preprocess=dataset.preprocess.model_dump(mode="json") if isinstance(dataset, CaptionedDataset) else {},
        device=device,
        batch_size=config.batch_size,
        where=f"{where}.model.family",
    )
    return {
        "count": manifest["count"],
        "latent_shape": manifest["image_shape"],
        "codec_fingerprint": manifest["codec_fingerprint"],
    }


def codec_adapter(model: CodecModelConfig, *, where: str) -> ModelAdapter:
    """The family whose ``encode_output_state`` fills the cache ``where`` (``latents.<name>``): its pipeline
    (``pretrained``, loaded whole), or the family without weights (a pixel-space family's codec holds none)."""
    cls = adapter_class(model.family, where=f"{where}.model.family")
    if model.pretrained is None:
        return cls.from_scratch(seed=0)
    source = PretrainedSource(
        model.pretrained, model.revision, model.variant, model.torch_dtype, model.components or {}
    )
    return pipeline_adapter(cls, source, model.options, where=where)
