"""A section's params (and so its fingerprint) leave out what its results do not depend on: fields added later
while they hold their default, and fields another field's value leaves unread; set, they are kept."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ValidationError

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.config.schema import (
    CodecModelConfig,
    CompileConfig,
    ConditionsConfig,
    DataRef,
    EvaluateConfig,
    ExportConfig,
    MetricConfig,
    ModelConfig,
    RewardConfig,
    StageConfig,
    StatisticBand,
)
from flowpost.core.trainers.optimizers import OptimizerConfig
from flowpost.core.trainers.rl.grpo import GRPOArguments
from flowpost_digits.config import DigitsDataset

PRETRAINED = {"pretrained", "revision", "variant", "torch_dtype", "components"}
DIGITS_FIELDS = {"source", "path", "split_seed", "image_size", "test_fraction"}
SD3 = {"family": "sd3", "pretrained": "stabilityai/stable-diffusion-3-medium-diffusers"}


@pytest.mark.parametrize(
    ("section", "left_out"),
    [
        (ModelConfig(), {"fallback", "options", "attention", "compile", "quantize", *PRETRAINED}),
        (CodecModelConfig(), {"options", *PRETRAINED}),
        (ConditionsConfig(datasets=["digits"]), {"model"}),
        (ConditionsConfig(model=SD3, datasets=["digits"]), {"encoder"}),
        (OptimizerConfig(lr=1e-4), {"momentum", "adamw_lr"}),
        (DataRef(dataset="digits", conditions="minilm"), {"latents"}),
        (RewardConfig(name="digit_adherence"), {"frames", "sampled_frames"}),
        (MetricConfig(name="fd"), {"key"}),
        (EvaluateConfig(), {"every", "compare_to_base"}),
        (ExportConfig(from_stage="sft"), {"promote"}),
        (StageConfig(trainer="sft"), {"optimizers", "guard", "offload"}),
        (GRPOArguments(), {"optimizer", "reward_normalisation", "overlap_rewards", "replay_memory_gib"}),
    ],
)
def test_a_section_leaves_out_what_its_results_do_not_depend_on(section: BaseModel, left_out: set[str]) -> None:
    dumped = set(section.model_dump())
    assert not dumped & left_out and dumped == set(type(section).model_fields) - left_out


@pytest.mark.parametrize(
    ("section", "kept"),
    [
        (ModelConfig(init="previous"), "fallback"),
        (ModelConfig(compile=CompileConfig()), "compile"),
        (ModelConfig(lora={"rank": 4}, quantize="int8"), "quantize"),
        (ConditionsConfig(model=SD3, datasets=["digits"]), "model"),
        (OptimizerConfig(name="muon", lr=0.02), "adamw_lr"),
        (EvaluateConfig(every=2), "every"),
        (EvaluateConfig(compare_to_base=True), "compare_to_base"),
        (MetricConfig(name="fd", key="fd_judge"), "key"),
        (RewardConfig(name="clip_score", frames="sampled", sampled_frames=2), "sampled_frames"),
        (GRPOArguments(overlap_rewards=True), "overlap_rewards"),
        (StageConfig(trainer="sft", offload=["ema"]), "offload"),
        (GRPOArguments(replay_steps_per_pass="auto", replay_memory_gib=1.0), "replay_memory_gib"),
    ],
)
def test_a_set_addition_or_a_field_that_applies_is_kept(section: BaseModel, kept: str) -> None:
    assert kept in section.model_dump()


def test_the_digits_keep_the_fields_they_always_dumped() -> None:
    assert set(DigitsDataset().model_dump()) == DIGITS_FIELDS


def test_a_pipeline_without_latent_caches_leaves_latents_out(tiny_pipeline) -> None:
    assert "latents" not in validate_pipeline(tiny_pipeline()).model_dump()


@pytest.mark.parametrize(
    "build",
    [
        lambda: CodecModelConfig(family="sd3", pretrained="x", options={"resolution": math.inf}),
        lambda: ModelConfig(transformer={"scale": math.nan}),
        lambda: RewardConfig(name="clip_score", options={"size": [1.0, math.inf]}),
        lambda: MetricConfig(name="brightness", options={"threshold": math.inf}),
        lambda: StatisticBand(max=1.0, options={"threshold": math.nan}),
    ],
)
def test_free_form_options_refuse_non_finite_numbers(build) -> None:
    with pytest.raises(ValidationError, match="is not a finite number; give a finite value"):
        build()
