"""One reward of a stage's (or a sampled dataset's) weighted sum."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from flowpost.core.config.base import FiniteOptions, OmittingModel


class RewardConfig(OmittingModel):
    """One reward of a weighted sum; ``options`` go to the scorer's constructor; on video, ``frames`` says
    what it scores (image stages leave the frame choice out of their params and fingerprints)."""

    OMITTED_AT_DEFAULT = ("frames", "sampled_frames")

    name: str
    weight: float = 1.0
    options: FiniteOptions = Field(default_factory=dict)
    frames: Literal["first", "sampled", "clip"] | None = Field(
        None, description="on video: the first frame, evenly sampled frames (their mean score) or the whole clip"
    )
    sampled_frames: int | None = Field(None, ge=1, description="with frames: sampled, how many frames (default 4)")

    @model_validator(mode="after")
    def _count_needs_sampled(self) -> RewardConfig:
        if self.sampled_frames is not None and self.frames != "sampled":
            raise ValueError("sampled_frames applies only to frames: sampled; set it or remove sampled_frames")
        return self
