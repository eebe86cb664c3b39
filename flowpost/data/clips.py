"""Decode one video file with PyAV into a training clip: frames sampled at a set rate, each preprocessed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flowpost.core.config.schema.media import FrameSampling, PreprocessConfig
from flowpost.data.preprocess import prepared_image
from flowpost.data.sources.items import BadItem

TOLERANCE = 1e-3  # seconds: timestamps this close to a sampling time count as on it (webm rounds to ms)


def training_clip(path: Path, frames: FrameSampling, config: PreprocessConfig, *, name: str) -> np.ndarray:
    """float32 [C, T, H, W] in [0, 1], ``T = frames.count``: for each time ``i / frames.fps`` after the first
    frame, the last frame shown at that time, preprocessed like an image (one crop for the whole clip).

    A BadItem when the file is missing, not decodable or truncated, or lasts too short for ``T`` frames.
    """
    import av

    times = [i / frames.fps for i in range(frames.count)]
    picked: list[np.ndarray] = []
    shown, last = None, 0.0
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise BadItem("unreadable_video", "the file has no video stream")
            start = None
            for frame in container.decode(container.streams.video[0]):
                if frame.time is None:
                    raise BadItem("unreadable_video", "a frame has no timestamp")
                start = frame.time if start is None else start
                last = frame.time - start
                while shown is not None and len(picked) < len(times) and last > times[len(picked)] + TOLERANCE:
                    picked.append(prepared_image(shown.to_image(), config, name=name))
                if len(picked) == len(times):
                    break
                shown = frame
    except (av.FFmpegError, OSError) as exc:
        raise BadItem("unreadable_video", f"not a readable video ({exc})") from None
    while shown is not None and len(picked) < len(times) and times[len(picked)] <= last + TOLERANCE:
        picked.append(prepared_image(shown.to_image(), config, name=name))
    if len(picked) < len(times):
        raise BadItem(
            "short_video",
            f"{len(picked)} of frames.count {frames.count} frames at frames.fps {frames.fps:g} "
            f"(the clip lasts {last:.3f} s after its first frame)",
        )
    return np.ascontiguousarray(np.stack(picked, axis=1))
