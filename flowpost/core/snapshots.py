"""The names of weight snapshots: frozen or time-shifted fp32 copies of the trainable weights
(``roles.Snapshots``), checkpointed as ``snapshot-<name>`` and written to ``final/<name>``."""

from __future__ import annotations

from enum import StrEnum


class Snapshot(StrEnum):
    """A snapshot's name. Trainers declare the ones they capture (``BaseTrainer.captured_snapshots``); the
    EMA callback holds ``EMA``."""

    TEACHER = "teacher"  # distillation: the weights the stage starts from
    REFERENCE = "ref"  # the policy the stage starts from, for a KL term or a preference margin
    EMA = "ema"  # the EMA callback's average of the trainable weights
    OLD = "old"  # NFT's old policy, moved towards the live one once per iteration; DGPO's, once per step
    ANCHOR = "anchor"  # AWM's lagged EMA anchor
    SAMPLER = "sampler"  # CRD's rollout weights, a slower EMA of the live ones than its old copy


SNAPSHOT_NAMES: frozenset[str] = frozenset(Snapshot)  # for membership tests on plain strings (role names)
