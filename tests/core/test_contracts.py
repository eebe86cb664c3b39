from __future__ import annotations

import dataclasses
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
    check_contracts,
)
from flowpost.core.progress import TrainingProgress
from flowpost.core.trainers.arguments import TrainerArguments
from flowpost.core.trainers.base import BaseTrainer
from flowpost.core.trainers.registry import (
    TRAINERS,
    arguments_class,
    trainer_class,
)
from flowpost.errors import FlowpostError

# -- contracts ------------------------------------------------------------------------------------


def test_named_contracts_pair_acquisition_and_feedback() -> None:
    assert ONLINE_EXECUTION_CONTRACT == ExecutionContract(Acquisition.GENERATION, Feedback.RUNTIME_REWARD)
    assert ONLINE_NO_FEEDBACK_EXECUTION_CONTRACT == ExecutionContract(Acquisition.GENERATION, Feedback.NONE)
    assert OFFLINE_EXECUTION_CONTRACT == ExecutionContract(Acquisition.DATASET, Feedback.NONE)
    assert str(OFFLINE_EXECUTION_CONTRACT) == "dataset+none"
    assert str(ONLINE_EXECUTION_CONTRACT) == "generation+runtime_reward"


@pytest.mark.parametrize(
    ("contract", "hooks"),
    [
        (OFFLINE_EXECUTION_CONTRACT, ("optimize_batch",)),
        (ONLINE_EXECUTION_CONTRACT, ("sample", "optimize")),
        (ONLINE_NO_FEEDBACK_EXECUTION_CONTRACT, ("sample", "optimize")),
    ],
)
def test_required_hooks_per_contract(contract: ExecutionContract, hooks: tuple[str, ...]) -> None:
    assert contract.required_hooks() == hooks


def test_contract_is_frozen_and_hashable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        OFFLINE_EXECUTION_CONTRACT.acquisition = Acquisition.GENERATION  # type: ignore[misc]
    assert len({OFFLINE_EXECUTION_CONTRACT, ExecutionContract(Acquisition.DATASET, Feedback.NONE)}) == 1


# -- BaseTrainer.__init_subclass__ ----------------------------------------------------------------


def test_dataset_trainer_without_optimize_batch_is_rejected_at_definition() -> None:
    with pytest.raises(TypeError, match="optimize_batch"):

        class NoBatch(BaseTrainer):
            execution_contract: ClassVar[ExecutionContract] = OFFLINE_EXECUTION_CONTRACT
            paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED


@pytest.mark.parametrize("contract", [ONLINE_EXECUTION_CONTRACT, ONLINE_NO_FEEDBACK_EXECUTION_CONTRACT])
def test_generation_trainer_missing_sample_is_rejected(contract: ExecutionContract) -> None:
    with pytest.raises(TypeError, match="sample"):

        class OnlyOptimize(BaseTrainer):
            execution_contract: ClassVar[ExecutionContract] = contract
            paradigm: ClassVar[Paradigm] = Paradigm.COUPLED

            def optimize(self, samples: list[Any]) -> None:
                return None


def test_generation_trainer_missing_optimize_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"missing \['optimize'\]"):

        class OnlySample(BaseTrainer):
            execution_contract: ClassVar[ExecutionContract] = ONLINE_EXECUTION_CONTRACT
            paradigm: ClassVar[Paradigm] = Paradigm.COUPLED

            def sample(self) -> list[Any]:
                return []


def test_dataset_trainer_that_also_defines_optimize_is_rejected() -> None:
    with pytest.raises(TypeError, match="another contract"):

        class Both(BaseTrainer):
            execution_contract: ClassVar[ExecutionContract] = OFFLINE_EXECUTION_CONTRACT
            paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED

            def optimize_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
                return {}

            def optimize(self, samples: list[Any]) -> None:
                return None


def test_generation_trainer_that_also_defines_optimize_batch_is_rejected() -> None:
    with pytest.raises(TypeError, match="optimize_batch"):

        class Both(BaseTrainer):
            execution_contract: ClassVar[ExecutionContract] = ONLINE_EXECUTION_CONTRACT
            paradigm: ClassVar[Paradigm] = Paradigm.COUPLED

            def sample(self) -> list[Any]:
                return []

            def optimize(self, samples: list[Any]) -> None:
                return None

            def optimize_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
                return {}


def test_correct_subclasses_define_fine() -> None:
    class Offline(BaseTrainer):
        execution_contract: ClassVar[ExecutionContract] = OFFLINE_EXECUTION_CONTRACT
        paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED

        def optimize_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
            return {}

    class Online(BaseTrainer):
        execution_contract: ClassVar[ExecutionContract] = ONLINE_EXECUTION_CONTRACT
        paradigm: ClassVar[Paradigm] = Paradigm.COUPLED

        def sample(self) -> list[Any]:
            return []

        def optimize(self, samples: list[Any]) -> None:
            return None

    assert Offline.execution_contract.required_hooks() == ("optimize_batch",)
    assert Online.optimize is not BaseTrainer.optimize


# -- registry -------------------------------------------------------------------------------------


def _arguments(contract: ExecutionContract, kind: Paradigm) -> type[TrainerArguments]:
    class MismatchArguments(TrainerArguments):
        execution_contract: ClassVar[ExecutionContract] = contract
        paradigm: ClassVar[Paradigm] = kind

    return MismatchArguments


class _OfflineDecoupled(BaseTrainer):
    execution_contract: ClassVar[ExecutionContract] = OFFLINE_EXECUTION_CONTRACT
    paradigm: ClassVar[Paradigm] = Paradigm.DECOUPLED

    def optimize_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {}


def test_check_contracts_accepts_matching_pair() -> None:
    check_contracts(_OfflineDecoupled, _arguments(OFFLINE_EXECUTION_CONTRACT, Paradigm.DECOUPLED))


def test_check_contracts_rejects_different_execution_contract() -> None:
    args = _arguments(ONLINE_NO_FEEDBACK_EXECUTION_CONTRACT, Paradigm.DECOUPLED)
    with pytest.raises(FlowpostError) as info:
        check_contracts(_OfflineDecoupled, args, where="stages.x.trainer")
    message = str(info.value)
    assert "_OfflineDecoupled" in message and "MismatchArguments" in message
    assert "execution_contract" in message
    assert info.value.where == "stages.x.trainer"


def test_check_contracts_rejects_different_paradigm() -> None:
    args = _arguments(OFFLINE_EXECUTION_CONTRACT, Paradigm.DISTILLATION)
    with pytest.raises(FlowpostError) as info:
        check_contracts(_OfflineDecoupled, args)
    message = str(info.value)
    assert "_OfflineDecoupled" in message and "MismatchArguments" in message
    assert "paradigm" in message and "distillation" in message and "decoupled" in message


def test_check_contracts_rejects_arguments_without_declarations() -> None:
    class Bare(TrainerArguments):
        pass

    with pytest.raises(FlowpostError, match="Bare"):
        check_contracts(_OfflineDecoupled, Bare)


def test_trainer_and_arguments_class_for_sft() -> None:
    from flowpost.core.trainers.offline.sft import SFTArguments, SFTTrainer

    assert trainer_class("sft") is SFTTrainer
    assert arguments_class("sft") is SFTArguments
    assert SFTTrainer.execution_contract == SFTArguments.execution_contract == OFFLINE_EXECUTION_CONTRACT


@pytest.mark.parametrize("lookup", [trainer_class, arguments_class])
def test_unknown_trainer_lists_known_names(lookup: Any) -> None:
    with pytest.raises(FlowpostError) as info:
        lookup("nosuchtrainer", where="stages.a.trainer")
    message = str(info.value)
    assert "nosuchtrainer" in message
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
