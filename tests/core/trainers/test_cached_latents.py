"""Training on a latent cache: the same steps as encoding the media every step, and a foreign cache refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_sd3_pipeline import load_sd3_adapter

from flowpost.core.models.base import ModelAdapter
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.trainers.offline.dpo import OfflineDPOTrainer
from flowpost.core.trainers.offline.sft import SFTTrainer
from flowpost.data.latent_cache import write_latent_cache
from flowpost.errors import FlowpostError


def _cache(adapter: ModelAdapter, dataset_dir: Path, out: Path, *, fingerprint: str | None = None) -> Path:
    """The dataset's latents, encoded in batches of 3 (the trainers read batches of 4)."""
    write_latent_cache(
        dataset_dir / "train",
        out,
        encode=adapter.encode_output_state,
        codec_fingerprint=fingerprint or adapter.codec_fingerprint(),
        preprocess={"resolution": 16, "crop": "center"},
        device=torch.device("cpu"),
        batch_size=3,
    )
    return out


def _weights(adapter: ModelAdapter) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in adapter.module().state_dict().items()}


def test_sft_steps_on_cached_sd3_latents_equal_encoding_with_the_vae_every_step(
    make_trainer, tmp_path, sd3_pipeline_dir, sd3_data_dirs
) -> None:
    latents = _cache(load_sd3_adapter(sd3_pipeline_dir), sd3_data_dirs[0], tmp_path / "latents")
    trained = {}
    for arm, cache in (("encoded", None), ("cached", latents)):
        adapter = load_sd3_adapter(sd3_pipeline_dir)
        trainer = make_trainer(tmp_path / arm, adapter=adapter, dirs=sd3_data_dirs, latents=cache, max_steps=2)
        assert trainer.start().optimizer_step == 2
        trained[arm] = _weights(adapter)
        assert ("vae" in vars(adapter)) == (cache is None)  # the cached arm never loads the VAE
    before = _weights(load_sd3_adapter(sd3_pipeline_dir))
    assert any(not torch.equal(before[k], v) for k, v in trained["cached"].items())
    for name, value in trained["encoded"].items():
        torch.testing.assert_close(trained["cached"][name], value, rtol=0, atol=0, msg=name)


def test_offline_dpo_on_cached_pairs_equals_encoding_them(make_trainer, tmp_path, pair_data_dirs) -> None:
    latents = _cache(TinySD3Adapter.from_scratch(seed=0), pair_data_dirs[0], tmp_path / "latents")
    losses = {}
    for arm, cache in (("encoded", None), ("cached", latents)):
        trainer = make_trainer(
            tmp_path / arm, cls=OfflineDPOTrainer, dirs=pair_data_dirs, init_from=tmp_path, latents=cache
        )
        batch = next(trainer.build_loader().iter_epoch(0))
        assert ("chosen_latents" in batch) == (cache is not None)
        losses[arm] = trainer.optimize_batch(batch)
    for key, value in losses["encoded"].items():
        torch.testing.assert_close(losses["cached"][key], value, rtol=0, atol=0, msg=key)


def test_a_cache_of_another_codec_is_refused_naming_the_stage_data(make_trainer, tmp_path, data_dirs) -> None:
    latents = _cache(TinySD3Adapter.from_scratch(seed=0), data_dirs[0], tmp_path / "latents", fingerprint="other")
    trainer = make_trainer(tmp_path / "out", cls=SFTTrainer, latents=latents, max_steps=1)
    with pytest.raises(FlowpostError, match="another codec") as error:
        trainer.start()
    assert error.value.where == "stages.sft.data.latents"
