"""Which weights of a trained stage a node reads (shared by training, evaluation and export)."""

from __future__ import annotations

from pathlib import Path

from flowpost.core.snapshots import Snapshot


def stage_weights(train_dir: Path, preferred: str) -> tuple[Path, str]:
    """``final/ema`` when preferred and present, else ``final/live``; and which it is."""
    if preferred == "ema" and (train_dir / "final" / Snapshot.EMA).is_dir():
        return train_dir / "final" / Snapshot.EMA, "ema"
    return train_dir / "final" / "live", "live"
