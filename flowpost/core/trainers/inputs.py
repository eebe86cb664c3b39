"""What a trainer reads, handed to it by the stage entry point (trainers never open files)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flowpost.core.conditions import ConditionBatch
from flowpost.errors import FlowpostError


@dataclass(frozen=True)
class ConditionTable:
    """Cached conditions of every prompt a stage may use, looked up by prompt string."""

    prompts: list[str]
    batch: ConditionBatch
    where: str = "conditions"

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rows", {prompt: row for row, prompt in enumerate(self.prompts)})

    def __contains__(self, prompt: str) -> bool:
        return prompt in self._rows  # type: ignore[attr-defined]

    def lookup(self, prompts: list[str]) -> ConditionBatch:
        """Rows for ``prompts`` in order (duplicates allowed)."""
        rows: dict[str, int] = self._rows  # type: ignore[attr-defined]
        missing = [p for p in prompts if p not in rows]
        if missing:
            raise FlowpostError(
                f"prompt {missing[0]!r} is not in the condition cache ({len(missing)} missing in all); "
                "re-run the conditions node",
                where=self.where,
            )
        return self.batch.index([rows[p] for p in prompts])


class RecordSource(Protocol):
    """Random access to a dataset's records, as per-sample dicts (``image``, ``prompt``, ...)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict[str, Any]: ...


class BatchLoader(Protocol):
    """A finite, rank-aware loader: the same batches per epoch on every run; ``dataset`` the records it draws."""

    @property
    def dataset(self) -> RecordSource: ...

    @property
    def batches_per_epoch(self) -> int: ...

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[dict[str, Any]]: ...


LoaderFactory = Callable[..., BatchLoader]


@dataclass
class StageInputs:
    """Data of one stage: conditions, demonstrations or preference pairs (as loader factories), prompts,
    assets; with a ``teacher-trajectories`` dataset the sigmas its records' states sit at; with a latent
    cache the fingerprint of the codec that filled it (its batches hold ``<arm>_latents``)."""

    conditions: ConditionTable | None = None
    demonstrations: LoaderFactory | None = None
    preferences: LoaderFactory | None = None
    trajectory_sigmas: list[float] | None = None
    latent_codec: str | None = None
    prompts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    assets_dir: Path | None = None

    def require(self, name: str, *, where: str) -> Any:
        value = getattr(self, name)
        if value is None or value == []:
            raise FlowpostError(f"this trainer needs {name} from the stage's data section", where=where)
        return value
