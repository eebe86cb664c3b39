"""``train.overlap_rewards``: decode and score each rollout forward batch on a worker thread while the
next one samples.

Torch operators release the GIL, so CPU-side scorers (JPEG size, OCR, a remote server's round trip) and
the VAE decode run beside the sampling loop. On CUDA the worker issues its work on its own stream,
which first waits for the event recorded after the batch's last sampling step, so device-resident
reward models run concurrently with the next batch's forwards. The batches are scored in submission
order, one at a time, with the same calls as without overlap: the rewards are the same; an error
raised by a scorer reaches the caller of ``collect`` unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import torch
from torch import Tensor

from flowpost.core.rewards.combine import RewardOutput

ScorePart = Callable[[Tensor, list[str], list[dict[str, Any]]], RewardOutput]


class OverlappedScoring:
    """Scores submitted forward batches on one worker thread (and, on CUDA, one side stream)."""

    def __init__(self, score: ScorePart, device: torch.device) -> None:
        self.score = score
        self.device = device
        self._worker: ThreadPoolExecutor | None = None
        self._stream: torch.cuda.Stream | None = None
        self._pending: list[Future[RewardOutput]] = []
        self._final: Tensor | None = None  # the rollout's samples the pending results belong to

    def begin(self) -> None:
        """Start a rollout: drop what an earlier rollout left unscored (waiting for its batches to end)."""
        wait(self._pending)
        self._pending, self._final = [], None

    def submit(self, final: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> None:
        """Start scoring one forward batch's final samples (the next batch may sample meanwhile)."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowpost-rewards")
        ready = None
        if self.device.type == "cuda":
            self._stream = self._stream or torch.cuda.Stream(self.device)
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        self._pending.append(self._worker.submit(self._run, final, ready, prompts, metadata))

    def _run(
        self, final: Tensor, ready: torch.cuda.Event | None, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> RewardOutput:
        with torch.no_grad():  # grad mode is per thread
            if ready is None or self._stream is None:
                return self.score(final, prompts, metadata)
            with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
                self._stream.wait_event(ready)
                final.record_stream(self._stream)  # the sampling stream may free it before this stream is done
                output = self.score(final, prompts, metadata)
            self._stream.synchronize()
            return output

    def finish(self, final: Tensor) -> None:
        """Mark the submitted batches as the forward batches of the rollout whose samples are ``final``."""
        self._final = final

    def collect(self, final: Tensor) -> RewardOutput | None:
        """The scores of the rollout whose samples are ``final``, in submission order, once all are done;
        None when the pending batches belong to another rollout (or there are none)."""
        pending, owner = self._pending, self._final
        self.begin()
        if owner is not final or not pending:
            return None
        return RewardOutput.cat([future.result() for future in pending])  # raises the first scorer error
