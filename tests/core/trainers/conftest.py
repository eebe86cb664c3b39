"""Tiny on-disk demonstration and preference-pair sets, a fake-encoded condition cache, and a trainer factory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pipeline_families import PIPELINE_FAMILIES
from tiny_flux1_kontext_pipeline import RESOLUTION as FLUX1_KONTEXT_RESOLUTION
from tiny_flux1_kontext_pipeline import seeded_kontext_states
from tiny_flux1_pipeline import RESOLUTION, load_flux1_adapter
from tiny_flux2_pipeline import RESOLUTION as FLUX2_RESOLUTION
from tiny_flux2_pipeline import load_flux2_adapter, load_flux2_klein_adapter
from tiny_qwen_image_edit_pipeline import RESOLUTION as QWEN_IMAGE_EDIT_RESOLUTION
from tiny_qwen_image_edit_pipeline import seeded_edit_states, seeded_plus_states
from tiny_qwen_image_pipeline import RESOLUTION as QWEN_IMAGE_RESOLUTION
from tiny_qwen_image_pipeline import load_qwen_image_adapter
from tiny_sd3_pipeline import load_sd3_adapter
from tiny_wan2_pipeline import FRAMES, HEIGHT, WIDTH, load_wan2_adapter
from tiny_z_image_pipeline import RESOLUTION as Z_IMAGE_RESOLUTION
from tiny_z_image_pipeline import load_z_image_adapter

from flowpost.core.callbacks.base import Callback
from flowpost.core.conditions import ConditionBatch
from flowpost.core.config.schema import CallbacksConfig, RewardConfig
from flowpost.core.evaluation.guard import StageGuard
from flowpost.core.io import write_json_atomic
from flowpost.core.models.base import ModelAdapter
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.sampling.config import SamplingConfig
from flowpost.core.trainers.base import BaseTrainer
from flowpost.core.trainers.offline.sft import SFTTrainer
from flowpost.core.trainers.optimizers import OptimizerConfig
from flowpost.core.trainers.registry import TRAINERS, arguments_class, trainer_class
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.condition_cache import update_condition_cache
from flowpost.data.records import Demonstration, PreferencePair
from flowpost.data.shards import write_shards
from flowpost.data.stage_inputs import load_stage_inputs
from flowpost.stage import build_callbacks, build_rewards, build_validation

TINY = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}
RECORDS = 20  # batch 4 -> 5 batches per epoch
FINGERPRINT = "test-encoder"
DATASET_TRAINERS = ("sft", "consistency", "kd", "offline-dpo")  # the fixture's default batch size fits their data


def _fake_encode(prompts: list[str]) -> ConditionBatch:
    seeds = [sum(map(ord, p)) for p in prompts]
    states = torch.stack([torch.randn(16, 384, generator=torch.Generator().manual_seed(s)) for s in seeds])
    return ConditionBatch(states, torch.ones(len(prompts), 16, dtype=torch.int8), states.mean(1))


def write_stage_data(
    root: Path, *, image_shape: tuple[int, ...], encode: Callable[[list[str]], ConditionBatch]
) -> tuple[Path, Path]:
    """``RECORDS`` random demonstrations of ``image_shape`` in shards and their prompts' condition cache."""
    rng = np.random.default_rng(0)
    records = [
        Demonstration(
            key=f"r{i}",
            prompt=f"digit {i % 10}",
            image=rng.random(image_shape, dtype=np.float32),
            label=i % 10,
        )
        for i in range(RECORDS)
    ]
    manifest = write_shards(records, root / "data" / "train", shard_size=7)
    write_json_atomic(root / "data" / "train" / "manifest.json", manifest)
    prompts = ["", *sorted({r.prompt for r in records})]
    update_condition_cache(root / "conditions", prompts, encoder_fingerprint=FINGERPRINT, encode=encode)
    return root / "data", root / "conditions"


def write_pair_data(root: Path, *, pairs: int) -> tuple[Path, Path]:
    """``pairs`` random 1x16x16 preference pairs in shards and their prompts' condition cache."""
    rng = np.random.default_rng(1)
    records = [
        PreferencePair(
            key=f"p{i}",
            prompt=f"digit {i % 10}",
            chosen=rng.random((1, 16, 16), dtype=np.float32),
            rejected=rng.random((1, 16, 16), dtype=np.float32),
            label=i % 10,
        )
        for i in range(pairs)
    ]
    manifest = write_shards(records, root / "data" / "train", shard_size=5)
    write_json_atomic(root / "data" / "train" / "manifest.json", manifest)
    prompts = ["", *sorted({r.prompt for r in records})]
    update_condition_cache(root / "conditions", prompts, encoder_fingerprint=FINGERPRINT, encode=_fake_encode)
    return root / "data", root / "conditions"


@pytest.fixture(scope="session")
def pair_data_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``RECORDS`` preference pairs: batch 4 gives 5 batches per epoch."""
    return write_pair_data(tmp_path_factory.mktemp("pair-data"), pairs=RECORDS)


@pytest.fixture(scope="session")
def data_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_stage_data(tmp_path_factory.mktemp("sft-data"), image_shape=(1, 16, 16), encode=_fake_encode)


@pytest.fixture(scope="session")
def sd3_data_dirs(tmp_path_factory: pytest.TempPathFactory, sd3_pipeline_dir: Path) -> tuple[Path, Path]:
    """The demonstrations as 16x16 RGB images, their prompts encoded by the sd3 adapter."""
    encode = load_sd3_adapter(sd3_pipeline_dir).encode_conditions
    return write_stage_data(tmp_path_factory.mktemp("sd3-data"), image_shape=(3, 16, 16), encode=encode)


@pytest.fixture(scope="session")
def flux1_data_dirs(tmp_path_factory: pytest.TempPathFactory, flux1_pipeline_dir: Path) -> tuple[Path, Path]:
    """The demonstrations as RGB images at the tiny FLUX resolution, their prompts encoded by the flux1 adapter."""
    encode = load_flux1_adapter(flux1_pipeline_dir).encode_conditions
    shape = (3, RESOLUTION, RESOLUTION)
    return write_stage_data(tmp_path_factory.mktemp("flux1-data"), image_shape=shape, encode=encode)


@pytest.fixture(scope="session")
def flux1_kontext_data_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demonstrations as RGB targets at the tiny FLUX.1-Kontext resolution, each prompt's edit conditions
    seeded (T5 states, the pooled vector and 4x4 source tokens: the stock 1024 px sources take seconds to encode)."""
    shape = (3, FLUX1_KONTEXT_RESOLUTION, FLUX1_KONTEXT_RESOLUTION)
    return write_stage_data(
        tmp_path_factory.mktemp("flux1-kontext-data"), image_shape=shape, encode=seeded_kontext_states
    )


@pytest.fixture(scope="session")
def wan2_data_dirs(tmp_path_factory: pytest.TempPathFactory, wan2_pipeline_dir: Path) -> tuple[Path, Path]:
    """The demonstrations as short RGB clips [3, T, H, W] at the tiny Wan size, their prompts encoded by wan2."""
    encode = load_wan2_adapter(wan2_pipeline_dir).encode_conditions
    shape = (3, FRAMES, HEIGHT, WIDTH)
    return write_stage_data(tmp_path_factory.mktemp("wan2-data"), image_shape=shape, encode=encode)


@pytest.fixture(scope="session")
def wan22_data_dirs(tmp_path_factory: pytest.TempPathFactory, wan22_pipeline_dir: Path) -> tuple[Path, Path]:
    """The same clips, their prompts encoded by the two-expert folder's own text encoder."""
    encode = load_wan2_adapter(wan22_pipeline_dir, family="wan22-a14b").encode_conditions
    shape = (3, FRAMES, HEIGHT, WIDTH)
    return write_stage_data(tmp_path_factory.mktemp("wan22-data"), image_shape=shape, encode=encode)


@pytest.fixture(scope="session")
def qwen_image_data_dirs(tmp_path_factory: pytest.TempPathFactory, qwen_image_pipeline_dir: Path) -> tuple[Path, Path]:
    """The demonstrations as RGB images at the tiny Qwen-Image resolution, their prompts encoded by its adapter
    (rows of different lengths, padded and masked)."""
    encode = load_qwen_image_adapter(qwen_image_pipeline_dir).encode_conditions
    shape = (3, QWEN_IMAGE_RESOLUTION, QWEN_IMAGE_RESOLUTION)
    return write_stage_data(tmp_path_factory.mktemp("qwen-image-data"), image_shape=shape, encode=encode)


@pytest.fixture(scope="session")
def qwen_image_edit_data_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demonstrations as RGB targets at the tiny Qwen-Image-Edit resolution, each prompt's edit conditions
    seeded (token states and 4x4 source tokens: the stock 1024 px sources take seconds each to encode)."""
    shape = (3, QWEN_IMAGE_EDIT_RESOLUTION, QWEN_IMAGE_EDIT_RESOLUTION)
    return write_stage_data(
        tmp_path_factory.mktemp("qwen-image-edit-data"), image_shape=shape, encode=seeded_edit_states
    )


@pytest.fixture(scope="session")
def qwen_image_edit_plus_data_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same targets, each prompt's conditions seeded with two 4x4 source grids."""
    shape = (3, QWEN_IMAGE_EDIT_RESOLUTION, QWEN_IMAGE_EDIT_RESOLUTION)
    return write_stage_data(
        tmp_path_factory.mktemp("qwen-image-edit-plus-data"), image_shape=shape, encode=seeded_plus_states
    )


@pytest.fixture(scope="session")
def z_image_data_dirs(tmp_path_factory: pytest.TempPathFactory, z_image_pipeline_dir: Path) -> tuple[Path, Path]:
    """The demonstrations as RGB images at the tiny Z-Image resolution, their prompts encoded by its adapter
    (rows of different lengths, padded and masked)."""
    encode = load_z_image_adapter(z_image_pipeline_dir).encode_conditions
    shape = (3, Z_IMAGE_RESOLUTION, Z_IMAGE_RESOLUTION)
    return write_stage_data(tmp_path_factory.mktemp("z-image-data"), image_shape=shape, encode=encode)


@pytest.fixture(scope="session")
def flux2_data_dirs(tmp_path_factory: pytest.TempPathFactory, flux2_pipeline_dir: Path) -> tuple[Path, Path]:
    """The demonstrations as RGB images at the tiny FLUX.2 resolution, their prompts encoded by the dev adapter."""
    encode = load_flux2_adapter(flux2_pipeline_dir).encode_conditions
    shape = (3, FLUX2_RESOLUTION, FLUX2_RESOLUTION)
    return write_stage_data(tmp_path_factory.mktemp("flux2-data"), image_shape=shape, encode=encode)


@pytest.fixture(scope="session")
def flux2_klein_data_dirs(
    tmp_path_factory: pytest.TempPathFactory, flux2_klein_pipeline_dir: Path
) -> tuple[Path, Path]:
    """The demonstrations as RGB images at the tiny FLUX.2 resolution, their prompts encoded by the klein adapter."""
    encode = load_flux2_klein_adapter(flux2_klein_pipeline_dir).encode_conditions
    shape = (3, FLUX2_RESOLUTION, FLUX2_RESOLUTION)
    return write_stage_data(tmp_path_factory.mktemp("flux2-klein-data"), image_shape=shape, encode=encode)


@pytest.fixture
def load_family(request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    """``load_family(name, **source_options)``: the family's freshly loaded adapter (``adapter``), its stage
    data (``dirs``) and its rollout guidance (``guidance``)."""

    def load(name: str, **options: Any) -> dict[str, Any]:
        loader, folder, data, guidance = PIPELINE_FAMILIES[name]
        adapter = loader(request.getfixturevalue(folder), **options)
        return {"adapter": adapter, "dirs": request.getfixturevalue(data), "guidance": guidance}

    return load


def _registered_name(cls: type) -> str:
    """The registry name of ``cls`` or of the registered trainer it extends."""
    registered = {trainer_class(name): name for name in TRAINERS}
    return next(registered[base] for base in cls.__mro__ if base in registered)


@pytest.fixture
def make_trainer(data_dirs: tuple[Path, Path]):  # noqa: ANN201
    """``make_trainer(out, cls=SFTTrainer, resume=True, callbacks={...}, listeners={}, lora_rank=None, **train_args)``.

    ``adapter`` and ``dirs`` (dataset and condition cache folders) replace the tiny model and its data,
    ``latents`` names a latent cache of that dataset to read instead of its media;
    ``init_from`` is the spec's starting weights (distillation and offline DPO need one: their teacher or
    reference is the init weights; the adapter is still the one given or built here).

    ``callbacks`` is a ``callbacks:`` config section; ``listeners`` adds callback objects by name;
    ``guard`` is the stage's guard; ``offload`` its ``offload:`` list.

    Any trainer class works; generation trainers also take ``sampling={...}`` and ``rewards=[...]``
    (reward config entries); multi-role trainers ``optimizers={role: {...}}``.
    """

    def make(
        out: Path,
        *,
        cls: type[BaseTrainer] = SFTTrainer,
        resume: bool = True,
        callbacks: dict[str, Any] | None = None,
        listeners: dict[str, Callback] | None = None,
        lora_rank: int | None = None,
        sampling: dict[str, Any] | None = None,
        rewards: list[dict[str, Any]] | None = None,
        adapter: ModelAdapter | None = None,
        dirs: tuple[Path, Path] | None = None,
        optimizers: dict[str, dict[str, Any]] | None = None,
        init_from: str | Path | None = None,
        latents: Path | None = None,
        guard: StageGuard | None = None,
        offload: list[str] | None = None,
        **args: Any,
    ) -> BaseTrainer:
        dataset_dir, conditions_dir = dirs or data_dirs
        spec = StageSpec(
            stage="sft",
            seed=0,
            config={"offload": offload} if offload else {},
            output_dir=str(out),
            dataset_dir=str(dataset_dir),
            conditions_dir=str(conditions_dir),
            latents_dir=None if latents is None else str(latents),
            encoder_fingerprint=FINGERPRINT,
            init_from=None if init_from is None else str(init_from),
            resume=resume,
        )
        name = _registered_name(cls)
        defaults = {"lr": 1e-3, **({"batch_size": 4} if name in DATASET_TRAINERS else {})}
        arguments = arguments_class(name).model_validate({**defaults, **args})
        inputs = load_stage_inputs(spec)
        callback_config = CallbacksConfig.model_validate(callbacks or {})
        built_rewards = build_rewards([RewardConfig.model_validate(r) for r in rewards or []], spec, inputs)
        adapter = adapter or TinySD3Adapter.from_scratch(seed=0, overrides=TINY)
        if lora_rank is not None:
            adapter.add_lora(rank=lora_rank, alpha=float(lora_rank))
        return cls(
            spec=spec,
            args=arguments,
            adapter=adapter,
            inputs=inputs,
            callbacks=build_callbacks(callback_config, spec, trainer=name, family="tiny-sd3") | (listeners or {}),
            validation=build_validation(callback_config, spec, inputs),
            guard=guard,
            sampling=SamplingConfig.model_validate(sampling or {}),
            **({"rewards": built_rewards} if built_rewards is not None else {}),
            **(
                {"optimizers": {k: OptimizerConfig.model_validate(v) for k, v in optimizers.items()}}
                if optimizers
                else {}
            ),
        )

    return make


@pytest.fixture
def fresh_weights():  # noqa: ANN201
    """The weights ``make_trainer`` starts from."""
    return TinySD3Adapter.from_scratch(seed=0, overrides=TINY).module().state_dict()
