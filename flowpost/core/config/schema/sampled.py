"""Datasets a finished stage samples: teacher trajectories and preference pairs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from flowpost.core.config.base import StrictModel
from flowpost.core.config.schema.rewards import RewardConfig

TRAJECTORIES = "teacher-trajectories"  # the source of sampled teacher trajectories
SAMPLED_PAIRS = "sampled-pairs"  # the source of preference pairs sampled from a trained stage


class TrajectoriesConfig(StrictModel):
    """Teacher ODE trajectories sampled once from a finished stage, at a few-step student's sigmas."""

    stage: str = Field(description="the finished stage whose weights are the teacher")
    weights: Literal["ema", "live"] = Field("ema", description="which weights of that stage; ema falls back to live")
    prompts: str = Field(description="the dataset whose training prompts are rolled out")
    conditions: str = Field(description="the condition cache that encodes those prompts")
    samples: int = Field(2000, ge=1, description="trajectories; prompts are taken in turn")
    steps: int = Field(4, ge=1, description="the student's steps: states are stored at its sigmas")
    substeps: int = Field(5, ge=1, description="teacher Euler steps per student step (steps x substeps in all)")
    guidance: float = Field(1.0, ge=0, description="classifier-free guidance of the teacher")
    batch_size: int = Field(250, ge=1, description="trajectories per teacher forward pass")


class SampledPairsConfig(StrictModel):
    """How the ``acquire.<dataset>`` node of a ``sampled-pairs`` dataset builds preference pairs: it samples
    ``candidates`` images per prompt and round from a trained stage, scores them with ``rewards`` (never the
    evaluation judge) and pairs the best with the worst."""

    stage: str = Field(description="the trained stage whose weights are sampled; the node runs after it")
    prompts: str = Field(description="the dataset whose training prompts (and labels) are sampled")
    conditions: str = Field(description="the condition cache that encodes those prompts")
    rewards: list[RewardConfig] = Field(
        min_length=1, description="the weighted reward that ranks the candidates, e.g. [{name: digit_adherence}]"
    )
    weights: Literal["ema", "live"] = Field("ema", description="which weights of the stage; ema falls back to live")
    candidates: int = Field(8, ge=2, description="samples per prompt and round; the best and the worst form a pair")
    rounds: int = Field(1, ge=1, description="pairs per prompt (each round draws new candidates)")
    steps: int = Field(20, ge=1, description="ODE steps per sample")
    guidance: float = Field(1.0, ge=0)
    min_gap: float = Field(0.0, ge=0, description="a group whose best and worst reward differ by less gives no pair")
    batch_size: int = Field(256, ge=1, description="samples per generation and scoring batch")
