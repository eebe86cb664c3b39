"""What one training stage process needs to run: written by the orchestrator, read by each rank."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowpost.core.io import read_json, write_json_atomic

PARENT_PID_ENV = "FLOWPOST_PARENT_PID"  # the orchestrator's pid, for the stage process to follow


@dataclass
class StageSpec:
    """A stage's resolved config plus the paths of its inputs and its output folder."""

    stage: str
    seed: int
    config: dict[str, Any]
    output_dir: str
    smoke: bool = False
    dataset_dir: str | None = None
    prompts_dir: str | None = None  # a prompt-files dataset replacing the dataset's rollout prompts
    conditions_dir: str | None = None
    latents_dir: str | None = None  # a latent cache of the dataset, read instead of its media
    encoder_fingerprint: str | None = None
    init_from: str | None = None
    resume: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    pipeline: str | None = None  # the pipeline's name, for trackers

    @property
    def num_processes(self) -> int:
        """``launch.num_processes`` (1 when the config has no launch section)."""
        return int(self.launch.get("num_processes") or 1)

    @property
    def launch(self) -> dict[str, Any]:
        """The stage's ``launch:`` section (empty when the config has none)."""
        return self.config.get("launch") or {}

    @property
    def offload(self) -> list[str]:
        """The stage's ``offload:`` list: snapshots, ``vae`` and ``rewards`` held in host memory between phases."""
        return list(self.config.get("offload") or [])

    def write(self, path: str | Path) -> None:
        write_json_atomic(path, asdict(self))

    @classmethod
    def read(cls, path: str | Path) -> StageSpec:
        return cls(**read_json(path, what="stage spec"))
