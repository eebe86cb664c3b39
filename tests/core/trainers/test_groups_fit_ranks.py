"""Trainers that compare a group's samples refuse a prompt count the ranks cannot split into whole groups."""

import pytest

from flowpost.core.trainers.arguments import groups_fit_ranks
from flowpost.core.trainers.distill.tdm_r1 import TDMR1Trainer
from flowpost.core.trainers.rl.crd import CRDTrainer
from flowpost.core.trainers.rl.dgpo import DGPOTrainer
from flowpost.core.trainers.rl.online_dpo import OnlineDPOTrainer
from flowpost.errors import FlowpostError


def test_prompts_that_split_evenly_over_the_ranks_pass() -> None:
    groups_fit_ranks(8, 4, where="stages.x.train.prompts_per_iteration")
    groups_fit_ranks(3, 1, where="stages.x.train.prompts_per_iteration")


def test_prompts_that_do_not_split_name_the_config_path() -> None:
    with pytest.raises(FlowpostError, match=r"prompts_per_iteration \(6\).*processes \(4\)") as error:
        groups_fit_ranks(6, 4, where="stages.dgpo.train.prompts_per_iteration")
    assert "stages.dgpo.train.prompts_per_iteration" in str(error.value)


@pytest.mark.parametrize("trainer", [DGPOTrainer, CRDTrainer, TDMR1Trainer, OnlineDPOTrainer])
def test_the_group_comparing_trainers_ask_for_whole_groups_per_rank(trainer: type) -> None:
    assert trainer.whole_groups or trainer.groups_on_one_rank
