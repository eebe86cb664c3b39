"""The evaluation split an acquisition leaves: held-out prompts, their metadata and real images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from flowpost.core.config.schema import dataset_config
from flowpost.data.eval_split import read_eval_split
from flowpost.data.splits import held_out
from flowpost.errors import FlowpostError
from flowpost.tasks.acquire import acquire_dataset

FOLDER = Path(__file__).resolve().parents[1] / "data" / "folder"


def test_an_image_folder_split_gives_its_held_out_captions_and_images(tmp_path: Path) -> None:
    config = dataset_config(
        {"source": "image-folder", "path": str(FOLDER), "preprocess": {"mode": "grayscale"}, "split": {"eval": 0.2}}
    )
    acquire_dataset(config, tmp_path)
    split = read_eval_split(tmp_path, where="evaluate.dataset")
    names = [p.relative_to(FOLDER).as_posix() for p in sorted(FOLDER.rglob("*.png"))]
    held = [name for name in names if held_out(name, 0.2, seed=0)]
    assert len(split.prompts) == len(held) == 3 and split.metadata == [{}] * 3
    assert split.reference is not None and split.reference.shape == (3, 1, 16, 16)
    expected = sorted(float(np.asarray(Image.open(FOLDER / name).convert("L")).mean()) / 255 for name in held)
    assert sorted(split.reference.mean(dim=(1, 2, 3)).tolist()) == pytest.approx(expected, abs=0.02)  # resized


def test_a_dataset_that_holds_nothing_out_says_so(tmp_path: Path) -> None:
    config = dataset_config({"source": "image-folder", "path": str(FOLDER)})
    acquire_dataset(config, tmp_path)
    with pytest.raises(FlowpostError, match=r"^evaluate\.dataset: .* holds no evaluation prompts"):
        read_eval_split(tmp_path, where="evaluate.dataset")
