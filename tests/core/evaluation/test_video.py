"""Videos as grids of their frames and as mp4 files, and ``sample`` on a video model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_wan2_pipeline import FRAMES, HEIGHT, WIDTH, load_wan2_adapter

from flowpost.core.evaluation.grid import frame_strips, make_grid
from flowpost.core.evaluation.video import save_video
from flowpost.core.sampling.generate import sample_prompts
from flowpost.errors import FlowpostError


def _decoded(path: Path) -> tuple[list[np.ndarray], float]:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)], float(stream.average_rate)


def test_a_video_grid_shows_each_clips_frames_side_by_side() -> None:
    videos = torch.arange(4.0).view(1, 1, 4, 1, 1).expand(2, 3, 4, 2, 3) / 3
    strips = frame_strips(videos)
    assert strips.shape == (2, 3, 2, 12)
    assert torch.equal(strips[0, 0, 0], torch.tensor([0.0] * 3 + [1 / 3] * 3 + [2 / 3] * 3 + [1.0] * 3))
    assert make_grid(videos, nrow=1, scale=1, padding=0).size == (12, 4)


def test_an_mp4_decodes_to_its_frames_at_its_rate(tmp_path: Path) -> None:
    videos = torch.zeros(3, 3, 6, 8, 10)
    videos[:, 0, 3:] = 1.0  # red from frame 3 on
    save_video(videos, tmp_path / "v.mp4", fps=12, nrow=2)
    frames, rate = _decoded(tmp_path / "v.mp4")
    assert len(frames) == 6 and rate == 12
    assert frames[0].shape == (2 * 9 + 1 + 1, 2 * 11 + 1 + 1, 3)  # 2x2 tiles of 8x10 and padding: 20 x 24
    assert frames[0][1:9, 1:11].mean() < 20 and frames[5][1:9, 1:11, 0].mean() > 200


@pytest.fixture(scope="module")
def model(wan2_pipeline_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Wan pipeline's transformer saved as a flowpost model at 8 fps."""
    folder = tmp_path_factory.mktemp("wan2-model")
    adapter = load_wan2_adapter(wan2_pipeline_dir)
    adapter.fps = 8
    adapter.save_pretrained(folder)
    return folder


def test_sample_writes_an_mp4_of_the_video_models_clips(model: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    videos, path = sample_prompts(model, ["a red cat"] * 2, steps=2, guidance=5.0, nrow=2)
    assert path == Path("sample.mp4") and videos.shape == (2, 3, FRAMES, HEIGHT, WIDTH)
    frames, rate = _decoded(tmp_path / path)
    assert len(frames) == FRAMES and rate == 8 and frames[0].shape == (HEIGHT + 2, 2 * WIDTH + 3 + 1, 3)
    _, grid = sample_prompts(model, ["a red cat"], out=tmp_path / "frames.png", steps=1)
    assert grid.is_file()
    with pytest.raises(FlowpostError, match=r"--out: 'wan2' makes videos; give a \.mp4"):
        sample_prompts(model, ["a red cat"], out=tmp_path / "x.gif", steps=1)


def test_the_sample_command_defaults_to_an_mp4_for_video(model: Path, tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from flowpost.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["sample", str(model), "--prompt", "a cat", "-n", "1", "--steps", "1"])
    assert result.exit_code == 0 and "wrote sample.mp4" in result.output
    assert len(_decoded(tmp_path / "sample.mp4")[0]) == FRAMES
