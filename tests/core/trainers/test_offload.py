"""``stages.NAME.offload``: offloaded snapshots give the same losses, weights and snapshots as resident ones, the
VAE and reward models leave the device outside the phases that run them, a resumed stage continues exactly, and
checkpoints hold each snapshot once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from flowpost.core.callbacks.base import Callback, TrainerView
from flowpost.core.events import read_events
from flowpost.core.trainers.distill.consistency import ConsistencyTrainer
from flowpost.core.trainers.distill.opd import OPDTrainer
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.core.trainers.rl.nft import NFTTrainer

JPEG = [{"name": "jpeg_incompressibility"}]
SMALL = {"prompts_per_iteration": 2, "group_size": 4, "rollout_batch_size": 8, "train_batch_size": 4}
EMA = {"ema": {"decay": 0.9, "schedule": "constant"}}
INIT = "teacher-weights"  # the spec's init_from: distillation needs one (its weights are the adapter's)
ONLINE = {"rewards": JPEG, "sampling": {"steps": 4}, "iterations": 2, "log_every": 1, **SMALL}
CASES: dict[str, tuple[list[str], dict[str, Any]]] = {  # case -> (offload, make_trainer's settings)
    "grpo-kl-ema": (["ref", "ema"], {"cls": GRPOTrainer, "kl_beta": 0.1, "callbacks": EMA, **ONLINE}),
    "nft-old-ref": (["old", "ref"], {"cls": NFTTrainer, "kl_beta": 0.1, **ONLINE}),
    "consistency-teacher-ema": (
        ["teacher", "ema"],
        {"cls": ConsistencyTrainer, "init_from": INIT, "callbacks": EMA, "max_steps": 2, "teacher_steps": 2},
    ),
    "opd-teacher": (
        ["teacher"],
        {
            "cls": OPDTrainer,
            "init_from": INIT,
            "sampling": {"dynamics": "ode", "steps": 3},
            "teacher_substeps": 3,
            "iterations": 2,
            "log_every": 1,
            **{**SMALL, "group_size": 1, "prompts_per_iteration": 4, "rollout_batch_size": 4, "train_batch_size": 2},
        },
    ),
}


def _progress(out: Path) -> list[dict[str, float]]:
    return [event["metrics"] for event in read_events(out / "events.jsonl") if event["event"] == "progress"]


def _state(trainer) -> dict[str, dict[str, torch.Tensor]]:
    """The trainable weights and every snapshot, on the host."""
    snapshots = trainer.adapter.snapshots
    live = {k: p.detach().cpu() for k, p in trainer.adapter.module().named_parameters() if p.requires_grad}
    return {"live": live} | {name: dict(snapshots.state_dict(name)) for name in snapshots.names()}


def _assert_same(a: dict[str, dict[str, torch.Tensor]], b: dict[str, dict[str, torch.Tensor]]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys(), name
        assert all(torch.equal(a[name][key], b[name][key]) for key in a[name]), name


@pytest.mark.parametrize(
    "case",
    [  # a dataset stage's loader takes most of the consistency case's 18 s here
        pytest.param(case, marks=pytest.mark.slow) if case.startswith("consistency") else case for case in sorted(CASES)
    ],
)
def test_offloaded_snapshots_give_the_same_losses_weights_and_snapshots(make_trainer, tmp_path, case) -> None:
    offload, settings = CASES[case]
    resident = make_trainer(tmp_path / "resident", resume=False, **settings)
    resident.start()
    offloaded = make_trainer(tmp_path / "offloaded", resume=False, offload=offload, **settings)
    assert offloaded.adapter.snapshots.hosted() == sorted(offload)
    offloaded.start()
    losses = [m["loss"] for m in _progress(tmp_path / "resident")]
    assert losses and losses == [m["loss"] for m in _progress(tmp_path / "offloaded")]  # exact
    _assert_same(_state(resident), _state(offloaded))
    held = offloaded.adapter.snapshots
    assert set(offload) <= set(held.names())
    assert all(t.device.type == "cpu" for name in offload for t in held.state_dict(name).values())


def test_a_stage_with_offloaded_snapshots_resumes_exactly_and_checkpoints_each_snapshot_once(
    make_trainer, tmp_path
) -> None:
    offload, settings = CASES["grpo-kl-ema"]
    straight = make_trainer(tmp_path / "straight", resume=False, offload=offload, **{**settings, "iterations": 3})
    straight.start()
    first = make_trainer(tmp_path / "resumed", offload=offload, checkpoint_every=1, **settings)
    first.start()
    resumed = make_trainer(tmp_path / "resumed", offload=offload, checkpoint_every=1, **{**settings, "iterations": 3})
    resumed.start()
    _assert_same(_state(straight), _state(resumed))
    assert [m["loss"] for m in _progress(tmp_path / "straight")] == [m["loss"] for m in _progress(tmp_path / "resumed")]
    assert all(t.device.type == "cpu" for name in offload for t in resumed.adapter.snapshots.state_dict(name).values())

    resident = make_trainer(tmp_path / "resident", checkpoint_every=1, **settings)
    resident.start()
    for run in ("resumed", "resident"):  # the same files, tensors and sizes: no snapshot held twice
        checkpoint = tmp_path / run / "checkpoints" / "step-4"
        files = sorted(path.name for path in checkpoint.iterdir() if path.suffix == ".safetensors")
        assert files == ["model.safetensors", "rng.safetensors", "snapshot-ema.safetensors", "snapshot-ref.safetensors"]
    for name in ("snapshot-ref", "snapshot-ema", "model"):
        a = load_file(tmp_path / "resumed" / "checkpoints" / "step-4" / f"{name}.safetensors")
        b = load_file(tmp_path / "resident" / "checkpoints" / "step-4" / f"{name}.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a), name


class ResidencyRecorder(Callback):
    """Records, in the optimizer steps (``optimize``) and validation grids (``evaluation``), which offloaded
    networks the trainer's residency holds on the device and where their tensors are."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, frozenset[str], dict[str, set[str]]]] = []

    def _record(self, trainer: TrainerView, phase: str) -> None:
        residency = trainer.residency  # type: ignore[attr-defined]
        self.seen.append((phase, frozenset(residency.resident), _devices(residency)))

    def on_step_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        self._record(trainer, "optimize")

    def on_validation_begin(self, trainer: TrainerView) -> None:
        self._record(trainer, "evaluation")


def _devices(residency) -> dict[str, set[str]]:
    """The device types each offloaded unit's tensors are on."""
    return {
        name: {tensor.device.type for network in unit.networks() for tensor in network.state_dict().values()}
        for name, unit in residency.units.items()
    }


def test_the_vae_and_the_reward_models_are_resident_only_in_the_phases_that_run_them(
    make_trainer, tmp_path, load_family
) -> None:
    from tiny_clip import build_tiny_clip

    family = load_family("sd3")
    recorder = ResidencyRecorder()
    clip = {"name": "clip_score", "options": {"model": str(build_tiny_clip(tmp_path / "clip"))}}
    validation = {"every": 1, "prompts": ["digit 1"], "samples_per_prompt": 1, "steps": 2}
    trainer = make_trainer(
        tmp_path / "run",
        cls=GRPOTrainer,
        adapter=family["adapter"],
        dirs=family["dirs"],
        lora_rank=4,
        rewards=[clip],
        sampling={"steps": 3, "guidance": family["guidance"]},
        callbacks={"validation": validation},
        listeners={"recorder": recorder},
        iterations=1,
        kl_beta=0.1,
        offload=["vae", "rewards", "ref"],
        **SMALL,
    )
    residency = trainer.residency
    assert set(residency.units) == {"vae", "rewards"} and trainer.adapter.snapshots.hosted() == ["ref"]
    assert residency.units["vae"].phases == {"reward", "evaluation"}
    assert residency.units["rewards"].phases == {"reward"}
    # found inside the weighted sum, its frame selection and the scorer: the CLIP model the scorer holds
    assert [type(network).__name__ for network in residency.units["rewards"].networks()] == ["CLIPModel"]
    trainer.start()
    device = trainer.accelerator.device.type
    phases = {phase for phase, _, _ in recorder.seen}
    assert phases == {"optimize", "evaluation"}
    for phase, resident, devices in recorder.seen:
        assert resident == ({"vae"} if phase == "evaluation" else set()), phase
        assert devices["rewards"] == {"cpu"} and devices["vae"] == ({device} if phase == "evaluation" else {"cpu"})
    with trainer.phase("reward"):  # what the loop's reward phase holds: both, on the compute device
        assert residency.resident == {"vae", "rewards"}
        assert _devices(residency)["vae"] == {device}
    assert residency.resident == {"vae", "rewards"}  # kept until the next phase says otherwise
    with trainer.phase("optimize"):
        assert residency.resident == set() and _devices(residency)["vae"] == {"cpu"}
    if device == "cpu":  # on the CPU the device is the host: no copies are made, nothing is pinned
        assert residency.host_bytes() == {"vae": 0, "rewards": 0}


def test_overlapped_scoring_keeps_the_vae_and_rewards_resident_while_the_rollout_samples(make_trainer, tmp_path):
    trainer = make_trainer(tmp_path, cls=GRPOTrainer, offload=["rewards"], overlap_rewards=True, **ONLINE)
    assert trainer.residency.units["rewards"].phases == {"rollout", "reward"}
    assert trainer.scoring_phases() <= trainer.codec_phases()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned host copies need a CUDA device")
def test_on_cuda_offloaded_networks_and_snapshots_sit_in_pinned_host_memory() -> None:
    from flowpost.core.residency import Residency
    from flowpost.core.roles import Snapshots

    device = torch.device("cuda")
    network = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)).to(device).eval()
    before = {key: value.clone() for key, value in network.state_dict().items()}
    residency = Residency(device)
    residency.add("vae", lambda: [network], {"reward"})
    with residency.phase("optimize"):
        assert all(t.device.type == "cpu" and t.is_pinned() for t in network.state_dict().values())
        with residency.phase("reward"):
            assert all(t.device == device or t.device.type == "cuda" for t in network.state_dict().values())
            assert all(torch.equal(before[k], v) for k, v in network.state_dict().items())
        assert all(t.device.type == "cpu" for t in network.state_dict().values())
    snapshots = Snapshots()
    snapshots.keep_on_host(["ref"], device)
    snapshots.capture("ref", network)
    assert all(t.is_pinned() for t in snapshots.state_dict("ref").values())
    x = torch.randn(4, 8, device=device)
    with residency.phase("reward"):
        expected = network(x)
        with snapshots.swapped_in("ref", network):
            assert torch.equal(network(x), expected)


def test_the_replay_with_an_offloaded_reference_runs_on_the_latents_device(make_trainer, tmp_path) -> None:
    """The network and the rollout on ``meta``, the reference in host memory: every torch call of the replay sees
    one device (the snapshot moves on its own first), and the snapshot stays on the host."""
    from one_device import OneDevice, rollout_on

    meta = torch.device("meta")
    trainer = make_trainer(tmp_path, cls=GRPOTrainer, kl_beta=0.1, offload=["ref"], **ONLINE)
    rollout = trainer.generate()
    trainer.rollouts.score(rollout)
    batch = rollout_on(trainer, rollout, meta).select([0, 1, 2, 3])
    batch.log_probs, batch.means = batch.log_probs.to(meta), batch.means.to(meta)
    with OneDevice():
        parts = list(trainer.replay_loss(batch, scale=1.0))
    assert parts and all(part.device == meta for part in parts)
    assert all(t.device.type == "cpu" for t in trainer.adapter.snapshots.state_dict("ref").values())
