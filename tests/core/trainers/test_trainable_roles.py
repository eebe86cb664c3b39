"""Trainable roles: declaration and validation, variants apart from snapshots, per-role optimizers."""

from __future__ import annotations

import copy

import pytest
import torch

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.roles import ComponentVariants
from flowpost.core.trainers.distill.dmd2 import DMD2Arguments, DMD2Trainer
from flowpost.core.trainers.distill.scores import FAKE_SCORE, GENERATOR
from flowpost.core.trainers.generation import GenerationTrainer
from flowpost.core.trainers.optimizers import OptimizerConfig, build_role_optimizer, muon_groups
from flowpost.core.trainers.role_plan import RoleUpdatePlan
from flowpost.errors import FlowpostError

TINY_NETWORK = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}


def _pipeline(tiny_pipeline, **dmd2):
    config = tiny_pipeline()
    stage = {
        "trainer": "dmd2",
        "model": {"family": "tiny-sd3", "init": "sft"},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "sampling": {"dynamics": "ode", "steps": 4},
        "optimizers": {GENERATOR: {"lr": 1e-5}, FAKE_SCORE: {"lr": 1e-5}},
        **dmd2,
    }
    config["stages"]["dmd2"] = stage
    return config


def test_a_multi_role_stage_validates_and_keeps_one_optimizer_per_role(tiny_pipeline):
    pipeline = validate_pipeline(_pipeline(tiny_pipeline))
    assert sorted(pipeline.stages["dmd2"].optimizers) == [FAKE_SCORE, GENERATOR]
    assert "optimizers" not in pipeline.stages["sft"].model_dump()  # other stages keep their params


@pytest.mark.parametrize(
    ("optimizers", "message"),
    [
        (
            {GENERATOR: {"lr": 1e-5}, FAKE_SCORE: {"lr": 1e-5}, "critic": {"lr": 1e-5}},
            "stages.dmd2.optimizers.critic: unknown role 'critic'",
        ),
        ({GENERATOR: {"lr": 1e-5}}, "stages.dmd2.optimizers.fake_score: trainer 'dmd2' trains role 'fake_score'"),
        (
            {GENERATOR: {"lr": 1e-5}, FAKE_SCORE: {"lr": 1e-5}, "teacher": {"lr": 1e-5}},
            "stages.dmd2.optimizers.teacher: 'teacher' is frozen weights",
        ),
    ],
)
def test_optimizers_name_each_role_once_and_never_a_snapshot(tiny_pipeline, optimizers, message):
    with pytest.raises(FlowpostError, match=message):
        validate_pipeline(_pipeline(tiny_pipeline, optimizers=optimizers))


def test_a_single_network_trainer_takes_no_optimizers(tiny_pipeline):
    config = tiny_pipeline()
    config["stages"]["sft"]["optimizers"] = {"model": {"lr": 1e-3}}
    with pytest.raises(FlowpostError, match="stages.sft.optimizers: trainer 'sft' trains one network"):
        validate_pipeline(config)


def test_muon_is_rejected_on_a_sharded_backend(tiny_pipeline):
    config = _pipeline(
        tiny_pipeline,
        optimizers={GENERATOR: {"name": "muon", "lr": 1e-3}, FAKE_SCORE: {"lr": 1e-5}},
        launch={"num_processes": 2, "backend": "fsdp2"},
    )
    with pytest.raises(FlowpostError, match="stages.dmd2.optimizers.generator.name: torch.optim.Muon .* fsdp2"):
        validate_pipeline(config)


def test_zero2_is_rejected_for_a_multi_role_stage(tiny_pipeline):
    config = _pipeline(tiny_pipeline, launch={"num_processes": 2, "backend": "deepspeed-zero2"})
    with pytest.raises(FlowpostError, match="stages.dmd2.launch.backend: deepspeed-zero2 steps one optimizer"):
        validate_pipeline(config)
    config["stages"]["dmd2"]["launch"]["backend"] = "fsdp2"
    assert validate_pipeline(config).stages["dmd2"].launch.backend == "fsdp2"


@pytest.mark.parametrize(
    ("roles", "message"),
    [(("generator", "generator"), "declared more than once"), (("generator", "teacher"), "a snapshot")],
)
def test_a_trainer_declaring_bad_roles_fails_at_definition(roles, message):
    with pytest.raises(TypeError, match=message):
        type("Bad", (GenerationTrainer,), {"Arguments": DMD2Arguments, "required_trainable_roles": roles})


def test_variants_start_equal_are_separate_and_are_not_snapshots():
    adapter = TinySD3Adapter.from_scratch(seed=0, overrides=TINY_NETWORK)
    base = adapter.module()
    adapter.add_component_variants([GENERATOR, FAKE_SCORE])
    fake = adapter.variants.module(FAKE_SCORE)
    assert adapter.variants.module(GENERATOR) is base and fake is not base
    assert all(torch.equal(a, b) for a, b in zip(base.parameters(), fake.parameters(), strict=True))
    assert {id(p) for p in base.parameters()}.isdisjoint(id(p) for p in fake.parameters())
    with adapter.use_component_variant(FAKE_SCORE):
        assert adapter.module() is fake
    assert adapter.module() is base
    with pytest.raises(KeyError, match="live trainable role"), adapter.use_snapshot(FAKE_SCORE):
        pass
    with pytest.raises(KeyError, match="frozen snapshot, not a trainable role"):
        adapter.variants.module("teacher")
    with pytest.raises(ValueError, match="declared more than once"):
        ComponentVariants(base, [GENERATOR, GENERATOR])


def test_a_snapshot_captured_under_a_role_name_is_rejected(make_trainer, tmp_path):
    class Clashing(DMD2Trainer):
        def setup(self) -> None:
            super().setup()
            self.adapter.snapshots.capture(FAKE_SCORE, self.adapter.module())

    with pytest.raises(FlowpostError, match="'fake_score' is a live trainable role"):
        make_trainer(
            tmp_path,
            cls=Clashing,
            sampling={"dynamics": "ode", "steps": 2},
            optimizers={GENERATOR: {"lr": 1e-3}, FAKE_SCORE: {"lr": 1e-3}},
        )


def test_a_trainer_missing_a_role_optimizer_names_the_section(make_trainer, tmp_path):
    with pytest.raises(FlowpostError, match="missing: fake_score"):
        make_trainer(
            tmp_path, cls=DMD2Trainer, sampling={"dynamics": "ode", "steps": 2}, optimizers={GENERATOR: {"lr": 1e-3}}
        )


def test_muon_takes_the_2d_weights_and_adamw_the_rest():
    network = TinySD3Adapter.from_scratch(seed=0, overrides=TINY_NETWORK).module()
    named = list(network.named_parameters())
    matrices, rest = muon_groups(named)
    assert matrices and rest and all(p.ndim == 2 for p in matrices) and all(p.ndim != 2 for p in rest)
    assert len(matrices) + len(rest) == len(named)
    role = build_role_optimizer(GENERATOR, named, OptimizerConfig(name="muon", lr=0.02, adamw_lr=1e-3), stage="dmd2")
    muon, adamw = role.optimizer
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    assert {id(p) for p in muon.param_groups[0]["params"]} == {id(p) for p in matrices}
    assert adamw.param_groups[0]["lr"] == 1e-3 and muon.param_groups[0]["lr"] == 0.02
    before = copy.deepcopy(network.state_dict())
    network(**_inputs()).sample.pow(2).mean().backward()
    role.step()
    assert all(not torch.equal(before[n], p) for n, p in named if p.grad is not None and p.grad.abs().sum() > 0)


def _inputs() -> dict:
    return {
        "hidden_states": torch.randn(2, 1, 16, 16),
        "encoder_hidden_states": torch.randn(2, 16, 384),
        "pooled_projections": torch.randn(2, 384),
        "timestep": torch.tensor([500.0, 900.0]),
    }


def test_an_update_plan_repeats_each_role_by_its_cadence_in_order():
    plan = RoleUpdatePlan(((FAKE_SCORE, 3), (GENERATOR, 1)))
    assert plan.round() == [FAKE_SCORE] * 3 + [GENERATOR] and plan.roles == (FAKE_SCORE, GENERATOR)
    with pytest.raises(ValueError, match="once"):
        RoleUpdatePlan(((FAKE_SCORE, 1), (FAKE_SCORE, 2)))
    with pytest.raises(ValueError, match="at least once"):
        RoleUpdatePlan(((FAKE_SCORE, 0),))


def test_a_multi_role_stage_takes_its_learning_rates_from_optimizers(tiny_pipeline):
    config = _pipeline(tiny_pipeline, train={"lr": 1e-3})
    with pytest.raises(FlowpostError, match="stages.dmd2.train.lr: trainer 'dmd2' has one optimizer per role"):
        validate_pipeline(config)
