from __future__ import annotations

import dataclasses
import inspect
from typing import Any, ClassVar

import pytest

from flowpost.core.contracts import (
    OFFLINE_EXECUTION_CONTRACT,
    ONLINE_EXECUTION_CONTRACT,
    ONLINE_NO_FEEDBACK_EXECUTION_CONTRACT,
    Acquisition,
    ExecutionContract,
    Feedback,
    Paradigm,
)
from flowpost.core.progress import TrainingProgress
from flowpost.core.snapshots import Snapshot
from flowpost.core.trainers.arguments import DatasetArguments, OnlineArguments
from flowpost.core.trainers.dataset import DatasetTrainer
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.registry import TRAINERS, arguments_class, trainer_class
from flowpost.errors import FlowpostError

# -- contracts ------------------------------------------------------------------------------------


def test_named_contracts_pair_acquisition_and_feedback() -> None:
    assert ONLINE_EXECUTION_CONTRACT == ExecutionContract(Acquisition.GENERATION, Feedback.RUNTIME_REWARD)
    assert ONLINE_NO_FEEDBACK_EXECUTION_CONTRACT == ExecutionContract(Acquisition.GENERATION, Feedback.NONE)
    assert OFFLINE_EXECUTION_CONTRACT == ExecutionContract(Acquisition.DATASET, Feedback.NONE)
    assert str(OFFLINE_EXECUTION_CONTRACT) == "dataset+none"
    assert str(ONLINE_EXECUTION_CONTRACT) == "generation+runtime_reward"


def test_contract_is_frozen_and_hashable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        OFFLINE_EXECUTION_CONTRACT.acquisition = Acquisition.GENERATION  # type: ignore[misc]
    assert len({OFFLINE_EXECUTION_CONTRACT, ExecutionContract(Acquisition.DATASET, Feedback.NONE)}) == 1


# -- the contract is the type ---------------------------------------------------------------------


class _DecoupledDataset(DatasetArguments):
    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED


class _DecoupledOnline(OnlineArguments):
    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED


def test_a_trainer_takes_its_contract_and_paradigm_from_its_arguments() -> None:
    class Offline(DatasetTrainer):
        Arguments = _DecoupledDataset

        def build_loader(self) -> Any: ...
        def optimize_batch(self, batch: dict[str, Any]) -> dict[str, Any]: ...

    assert Offline.execution_contract == OFFLINE_EXECUTION_CONTRACT
    assert Offline.paradigm is Paradigm.DECOUPLED
    assert not inspect.isabstract(Offline)


@pytest.mark.parametrize(
    ("base", "hooks"),
    [(DatasetTrainer, {"build_loader", "optimize_batch"}), (GenerationTrainer, {"sample", "optimize"})],
)
def test_a_trainer_type_leaves_exactly_its_contract_hooks_abstract(base: type, hooks: set[str]) -> None:
    assert base.__abstractmethods__ == frozenset(hooks)


def test_a_dataset_trainer_without_optimize_batch_cannot_be_built() -> None:
    class NoBatch(DatasetTrainer):
        Arguments = _DecoupledDataset

        def build_loader(self) -> Any: ...

    with pytest.raises(TypeError, match="optimize_batch"):
        NoBatch(spec=None, args=None, adapter=None)  # type: ignore[arg-type]


def test_a_trainer_that_declares_its_own_contract_is_rejected_at_definition() -> None:
    with pytest.raises(TypeError, match="Arguments class only"):

        class Redeclared(DatasetTrainer):
            Arguments = _DecoupledDataset
            execution_contract = OFFLINE_EXECUTION_CONTRACT


@pytest.mark.parametrize(
    ("base", "arguments", "expected"),
    [(DatasetTrainer, _DecoupledOnline, "DatasetArguments"), (GenerationTrainer, _DecoupledDataset, "OnlineArguments")],
)
def test_arguments_of_the_other_trainer_type_are_rejected(base: type, arguments: type, expected: str) -> None:
    with pytest.raises(TypeError, match=expected):
        type("Mixed", (base,), {"Arguments": arguments})


def test_online_arguments_declaring_the_dataset_contract_are_rejected() -> None:
    class Confused(_DecoupledOnline):
        execution_contract: ClassVar[ExecutionContract] = OFFLINE_EXECUTION_CONTRACT

    with pytest.raises(TypeError, match="dataset\\+none"):
        type("Mixed", (GenerationTrainer,), {"Arguments": Confused})


def test_arguments_without_a_paradigm_are_rejected() -> None:
    class Bare(DatasetArguments):
        pass

    with pytest.raises(TypeError, match="Bare must declare"):
        type("NoParadigm", (DatasetTrainer,), {"Arguments": Bare})


@pytest.mark.parametrize(
    ("snapshots", "message"),
    [
        ({"ref": None}, "'ref' is no Snapshot"),
        ({Snapshot.REFERENCE: "kl_bta"}, "'ref' is switched on by 'kl_bta', no field of _DecoupledDataset"),
    ],
)
def test_a_snapshot_declaration_is_checked_at_definition(snapshots: dict, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        type("Bad", (DatasetTrainer,), {"Arguments": _DecoupledDataset, "captured_snapshots": snapshots})


def test_a_switched_snapshot_is_held_while_its_field_is_set() -> None:
    class Switched(_DecoupledDataset):
        kl_beta: float = 0.0

    trainer = type(
        "WithReference",
        (DatasetTrainer,),
        {"Arguments": Switched, "captured_snapshots": {Snapshot.TEACHER: None, Snapshot.REFERENCE: "kl_beta"}},
    )
    assert trainer.snapshots_held(Switched()) == {Snapshot.TEACHER}
    assert trainer.snapshots_held(Switched(kl_beta=0.1)) == {Snapshot.TEACHER, Snapshot.REFERENCE}
    with pytest.raises(TypeError, match="no field of _DecoupledDataset"):  # a subclass's Arguments lacks it
        type("Narrowed", (trainer,), {"Arguments": _DecoupledDataset})


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_every_registered_trainer_is_of_the_type_its_contract_names(name: str) -> None:
    trainer = trainer_class(name)
    assert arguments_class(name) is trainer.Arguments
    assert trainer.execution_contract == trainer.Arguments.execution_contract
    expected = DatasetTrainer if trainer.execution_contract.acquisition is Acquisition.DATASET else GenerationTrainer
    assert issubclass(trainer, expected) and not inspect.isabstract(trainer)


def test_trainer_and_arguments_class_for_sft() -> None:
    from flowpost.core.trainers.offline.sft import SFTArguments, SFTTrainer

    assert trainer_class("sft") is SFTTrainer
    assert arguments_class("sft") is SFTArguments
    assert SFTTrainer.execution_contract == OFFLINE_EXECUTION_CONTRACT


@pytest.mark.parametrize("lookup", [trainer_class, arguments_class])
def test_unknown_trainer_suggests_the_closest_name_and_lists_known_ones(lookup: Any) -> None:
    with pytest.raises(FlowpostError) as info:
        lookup("gpro", where="stages.a.trainer")
    message = str(info.value)
    assert "did you mean 'grpo'" in message
    for name in TRAINERS:
        assert name in message
    assert message.startswith("stages.a.trainer")


def test_registry_names_are_lowercase() -> None:
    assert all(name == name.lower() for name in TRAINERS)
    with pytest.raises(FlowpostError):
        trainer_class("SFT")


# -- progress -------------------------------------------------------------------------------------


def test_progress_is_frozen() -> None:
    progress = TrainingProgress()
    with pytest.raises(dataclasses.FrozenInstanceError):
        progress.optimizer_step = 3  # type: ignore[misc]
    assert progress.optimizer_step == 0


def test_progress_helpers_advance_counters() -> None:
    start = TrainingProgress(optimizer_step=4, rollout_iteration=2, data_epoch=1, epoch_cursor=6)
    stepped = start.after_optimizer_step(3)
    assert stepped == TrainingProgress(optimizer_step=5, rollout_iteration=2, data_epoch=1, epoch_cursor=9)
    epoch = stepped.after_epoch()
    assert epoch == TrainingProgress(optimizer_step=5, rollout_iteration=2, data_epoch=2, epoch_cursor=0)
    rollout = epoch.after_rollout()
    assert rollout == TrainingProgress(optimizer_step=5, rollout_iteration=3, data_epoch=2, epoch_cursor=0)
    # the originals are untouched
    assert start == TrainingProgress(optimizer_step=4, rollout_iteration=2, data_epoch=1, epoch_cursor=6)


def test_progress_dict_round_trip() -> None:
    progress = TrainingProgress(optimizer_step=7, rollout_iteration=3, data_epoch=2, epoch_cursor=5)
    data = progress.to_dict()
    assert data == {"optimizer_step": 7, "rollout_iteration": 3, "data_epoch": 2, "epoch_cursor": 5}
    assert TrainingProgress.from_dict(data) == progress


def test_progress_from_dict_ignores_unknown_keys_and_defaults_missing() -> None:
    restored = TrainingProgress.from_dict({"optimizer_step": "11", "future_counter": 9})
    assert restored == TrainingProgress(optimizer_step=11)
