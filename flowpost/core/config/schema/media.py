"""The blocks a captioned dataset reads its media with: preprocessing, the held-out split, a clip's frames and a
dataset on the hub."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from flowpost.core.config.base import StrictModel


class PreprocessConfig(StrictModel):
    """How acquisition turns a source image (or each frame of a clip) into a training image (fingerprinted)."""

    resolution: int = Field(16, ge=8, le=4096, multiple_of=4, description="square side in pixels")
    crop: Literal["center", "random"] = Field(
        "center", description="after resizing the short side: random crops are addressed by seed and item"
    )
    mode: Literal["grayscale", "rgb"] = Field("rgb", description="the model's channels: 1 (grayscale) or 3 (rgb)")
    seed: int = Field(0, description="with crop: random, the seed the per-item crop offsets derive from")
    background: Literal["white", "black"] = Field(
        "white", description="the colour transparent pixels are composited on (their hidden colour never shows)"
    )
    max_megapixels: float = Field(
        100.0, gt=0, description="larger images are skipped as bad items (oversized_image) before they are decoded"
    )


class SplitConfig(StrictModel):
    """A held-out share of the items, chosen by the hash of each item's name."""

    eval: float = Field(0.0, ge=0, lt=1, description="fraction of the items held out for evaluation")


class FrameSampling(StrictModel):
    """Which frames of a clip video-folder keeps: ``count`` frames ``1 / fps`` seconds apart from its start."""

    count: int = Field(8, ge=1, le=1024, description="frames per clip; a shorter clip is a bad item")
    fps: float = Field(8.0, gt=0, le=240, description="the rate the frames are sampled at, whatever the clip's own")


class HubDataset(StrictModel):
    """A dataset on the Hugging Face hub, loaded by ``datasets.load_dataset`` (needs the network unless cached)."""

    id: str = Field(min_length=1, description="the hub id, e.g. 'user/pets'")
    name: str | None = Field(None, description="the dataset's configuration (subset)")
    split: str = Field("train", min_length=1, description="the hub split to read")
    revision: str | None = Field(None, description="a branch, tag or commit; a commit is needed with HF_HUB_OFFLINE")
