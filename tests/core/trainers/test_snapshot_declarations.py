"""Every registered trainer holds exactly the snapshots it declares (what the memory preflight counts), with and
without EMA and the switches of its optional snapshots; a snapshot captured undeclared fails the build."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from flowpost.core.config.schema import StageConfig
from flowpost.core.io import read_json, write_json_atomic
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR
from flowpost.core.trainers.distill.tdm_r1 import SURROGATE
from flowpost.core.trainers.offline.sft import SFTTrainer
from flowpost.core.trainers.registry import TRAINERS, trainer_class
from flowpost.errors import FlowpostError
from flowpost.tasks.preflight import stage_snapshots

JPEG = [{"name": "jpeg_compressibility"}]
TWO_ROLES = {
    "sampling": {"dynamics": "ode", "steps": 2},
    "optimizers": {GENERATOR: {"lr": 1e-3}, FAKE_SCORE: {"lr": 1e-3}},
}
INIT = "teacher-weights"  # distillation and offline DPO start from trained weights (the adapter's here)
BUILD: dict[str, dict[str, Any]] = {  # what make_trainer needs to build each registered trainer
    "sft": {},
    "offline-dpo": {"dirs": "pairs", "init_from": INIT},
    "grpo": {"rewards": JPEG},
    "grpo-guard": {"rewards": JPEG},
    "mixgrpo": {"rewards": JPEG, "sampling": {"window": 2}},
    "dppo": {"rewards": JPEG},
    "branchgrpo": {"rewards": JPEG},
    "online-dpo": {"rewards": JPEG},
    "awm": {"rewards": JPEG},
    "nft": {"rewards": JPEG},
    "dgpo": {"rewards": JPEG, "sampling": {"dynamics": "ode", "steps": 4}, "train_timesteps": 2},
    "crd": {"rewards": JPEG, "sampling": {"steps": 4}, "train_timesteps": 2},
    "dmd2": TWO_ROLES,
    "tdm": TWO_ROLES,
    "tdm-r1": {
        "rewards": JPEG,
        "sampling": TWO_ROLES["sampling"],
        "optimizers": {**TWO_ROLES["optimizers"], SURROGATE: {"lr": 1e-3}},
    },
    "consistency": {"init_from": INIT, "target_weights": "live"},
    "diffusion-opd": {"init_from": INIT},
    "kd": {"dirs": "trajectories"},
}
SWITCHES = ("kl_beta", "ema_kl_beta")  # the train: fields of optional snapshots, off (0) or on


@pytest.fixture(scope="module")
def trajectory_dirs(tmp_path_factory: pytest.TempPathFactory, data_dirs: tuple[Path, Path]) -> tuple[Path, Path]:
    """The demonstrations relabelled as a teacher-trajectories dataset (kd reads its sigmas when it is built)."""
    dataset = tmp_path_factory.mktemp("trajectories") / "data"
    shutil.copytree(data_dirs[0], dataset)
    manifest = dataset / "train" / "manifest.json"
    write_json_atomic(manifest, {**read_json(manifest), "trajectory": {"sigmas": [1.0, 0.5, 0.0]}})
    return dataset, data_dirs[1]


@pytest.mark.parametrize("on", [False, True], ids=["bare", "ema+switches"])
@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_a_trainer_holds_the_snapshots_the_preflight_counts(
    name: str, on: bool, make_trainer, pair_data_dirs, trajectory_dirs, tmp_path: Path
) -> None:
    cls = trainer_class(name)
    build = dict(BUILD[name])
    build["dirs"] = {"pairs": pair_data_dirs, "trajectories": trajectory_dirs}.get(build.get("dirs"))
    train = {key: 0.01 if on else 0.0 for key in SWITCHES if key in cls.Arguments.model_fields}
    callbacks = {"ema": {"decay": 0.9}} if on else {}
    trainer = make_trainer(tmp_path, cls=cls, callbacks=callbacks, **build, **train)
    trainer.callbacks.on_train_start(trainer)  # where the EMA callback captures its snapshot
    stage = StageConfig(trainer=name, train=train, callbacks=callbacks)
    assert set(trainer.adapter.snapshots.names()) == stage_snapshots(stage)


def test_a_snapshot_captured_without_a_declaration_fails_the_build(make_trainer, tmp_path: Path) -> None:
    class Undeclared(SFTTrainer):
        def setup(self) -> None:
            super().setup()
            self.adapter.snapshots.capture(Snapshot.REFERENCE, self.adapter.module())

    with pytest.raises(FlowpostError, match="captured the snapshot\\(s\\) ref, which its captured_snapshots") as error:
        make_trainer(tmp_path, cls=Undeclared)
    assert error.value.where == "stages.sft.trainer"

    class Declared(Undeclared):
        captured_snapshots = {Snapshot.REFERENCE: None}

    assert make_trainer(tmp_path, cls=Declared).adapter.snapshots.names() == [Snapshot.REFERENCE]
