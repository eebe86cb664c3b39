"""Videos as mp4 files: a batch of clips tiled into one H.264 video."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from torch import Tensor

from flowpost.core.evaluation.grid import make_grid
from flowpost.core.io import write_bytes_atomic


def video_frames(videos: Tensor, *, nrow: int) -> list[np.ndarray]:
    """Videos [B, C, T, H, W] in [0, 1] as T RGB uint8 frames [H', W', 3], the clips tiled ``nrow`` per row
    and padded to even sides (H.264 in yuv420p needs them)."""
    frames = []
    for index in range(videos.shape[2]):
        tile = np.asarray(make_grid(videos[:, :, index], nrow=nrow, scale=1))
        rgb = np.repeat(tile[..., None], 3, axis=2) if tile.ndim == 2 else tile
        height, width = rgb.shape[:2]
        frames.append(np.pad(rgb, ((0, height % 2), (0, width % 2), (0, 0))))
    return frames


def save_video(videos: Tensor, path: str | Path, *, fps: int, nrow: int) -> None:
    """Write ``video_frames`` of ``videos`` to ``path`` as an H.264 mp4 at ``fps``, atomically."""
    import av

    frames = video_frames(videos, nrow=nrow)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    write_bytes_atomic(path, buffer.getvalue())
