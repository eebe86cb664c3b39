"""A training checkpoint's weights, put into an adapter loaded from the same stage's final weights."""

from __future__ import annotations

from pathlib import Path

from flowpost.core.checkpoint import load_checkpoint
from flowpost.core.models.base import ModelAdapter
from flowpost.core.progress import TrainingProgress
from flowpost.core.snapshots import Snapshot
from flowpost.errors import FlowpostError


def load_checkpoint_weights(adapter: ModelAdapter, path: Path, *, weights: str) -> TrainingProgress:
    """Load checkpoint ``path``'s live weights, with its ``ema`` snapshot over them when ``weights`` is
    ``ema``, into ``adapter``'s network (hashes checked); return the checkpoint's progress."""
    state = load_checkpoint(path)
    network = adapter.module()
    if set(state.model) != set(network.state_dict()):
        raise FlowpostError(
            f"checkpoint {path} holds weights laid out unlike the stage's final weights (LoRA adapters or several "
            "trainable roles); checkpoint curves score stages that fully fine-tune one network: remove "
            "evaluate.every, or evaluate this stage's final weights only",
            where="evaluate.every",
        )
    tensors = dict(state.model)
    if weights == "ema":
        if Snapshot.EMA not in state.snapshots:
            raise FlowpostError(
                f"checkpoint {path} holds no ema snapshot although the final weights do; retrain the stage from "
                "the start (--no-resume)",
                where=str(path),
            )
        tensors |= state.snapshots[Snapshot.EMA]
    network.load_state_dict(tensors)
    return TrainingProgress.from_dict(state.trainer["progress"])
