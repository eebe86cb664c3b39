"""Two-process data parallelism (torchrun, gloo on CPU) through the real stage launch path."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from flowpost.core.events import DoneEvent, read_events
from flowpost.core.process_group import Topology
from flowpost.core.trainers.spec import StageSpec
from flowpost.errors import FlowpostError
from flowpost.tasks.train import run_training, threads_per_process

TINY = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}
SFT = {"lr": 1e-4, "batch_size": 4, "max_steps": 4, "checkpoint_every": 2, "log_every": 1}
GRPO = {
    "lr": 1e-4,
    "iterations": 2,
    "prompts_per_iteration": 2,
    "group_size": 4,
    "rollout_batch_size": 8,
    "train_batch_size": 4,
    "kl_beta": 0.1,
    "log_every": 1,
}


def _spec(
    out: Path,
    data_dirs: tuple[Path, Path],
    trainer: str,
    train: dict,
    processes: int,
    backend: str = "ddp",
    **stage: Any,
) -> StageSpec:
    dataset_dir, conditions_dir = data_dirs
    config = {
        "trainer": trainer,
        "model": {"family": "tiny-sd3", "transformer": TINY},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "train": train,
        "callbacks": {"ema": {"decay": 0.9}, "grad_clip": {"max_norm": 1.0}},
        **stage,
        "launch": {"num_processes": processes, "hang_timeout": 300, "backend": backend, **stage.get("launch", {})},
    }
    return StageSpec(
        stage=trainer,
        seed=0,
        config=config,
        output_dir=str(out),
        dataset_dir=str(dataset_dir),
        conditions_dir=str(conditions_dir),
        encoder_fingerprint="test-encoder",
    )


def _weights(out: Path, kind: str = "live") -> dict[str, torch.Tensor]:
    return load_file(out / "final" / kind / "transformer" / "diffusion_pytorch_model.safetensors")


def _metrics(out: Path) -> list[dict[str, float]]:
    return [e["metrics"] for e in read_events(out / "events.jsonl") if e["event"] == "progress"]


STAGES = [
    ("sft", SFT, {}),
    ("grpo", GRPO, {"sampling": {"steps": 4}, "rewards": [{"name": "jpeg_incompressibility"}]}),
]


@pytest.mark.parametrize(("trainer", "train", "stage"), STAGES)
def test_ddp_two_processes_match_one_process_with_the_same_global_batch(
    tmp_path, one_process, data_dirs, fresh_weights, trainer, train, stage
) -> None:
    _two_processes_match_one(tmp_path, one_process, data_dirs, fresh_weights, trainer, train, stage, backend="ddp")


@pytest.mark.parametrize(("trainer", "train", "stage"), STAGES)
def test_fsdp_two_sharded_processes_match_one_process_with_the_same_global_batch(
    tmp_path, one_process, data_dirs, fresh_weights, trainer, train, stage
) -> None:
    _two_processes_match_one(tmp_path, one_process, data_dirs, fresh_weights, trainer, train, stage, backend="fsdp2")


@pytest.mark.parametrize(("trainer", "train", "stage"), STAGES)
def test_zero2_two_deepspeed_processes_match_one_process_with_the_same_global_batch(
    tmp_path, one_process, data_dirs, fresh_weights, trainer, train, stage
) -> None:
    _two_processes_match_one(
        tmp_path, one_process, data_dirs, fresh_weights, trainer, train, stage, backend="deepspeed-zero2"
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp", "fsdp2", "deepspeed-zero2"])
def test_lora_sft_on_two_processes_matches_one_process(
    tmp_path, one_process, data_dirs, fresh_weights, backend
) -> None:
    stage = {"model": {"family": "tiny-sd3", "transformer": TINY, "lora": {"rank": 4}}}
    _two_processes_match_one(tmp_path, one_process, data_dirs, fresh_weights, "sft", SFT, stage, backend=backend)


DMD2 = {
    "iterations": 2,
    "prompts_per_iteration": 4,
    "rollout_batch_size": 4,
    "train_batch_size": 2,
    "ttur": 2,
    "log_every": 1,
}
ROLES = {
    "sampling": {"dynamics": "ode", "steps": 2},
    "optimizers": {"generator": {"lr": 1e-3}, "fake_score": {"lr": 1e-3, "warmup_steps": 3}},
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_a_multi_role_dmd2_stage_on_two_processes_matches_one_process(
    tmp_path, one_process, data_dirs, fresh_weights, backend
) -> None:
    _two_processes_match_one(tmp_path, one_process, data_dirs, fresh_weights, "dmd2", DMD2, ROLES, backend=backend)


BF16 = {"launch": {"mixed_precision": "bf16"}}


def test_a_bf16_stage_trains_near_the_fp32_stage_and_keeps_fp32_weights(tmp_path, data_dirs, fresh_weights) -> None:
    run_training(_spec(tmp_path / "fp32", data_dirs, "sft", SFT, 1))
    run_training(_spec(tmp_path / "bf16", data_dirs, "sft", SFT, 1, **BF16))
    full, mixed = _weights(tmp_path / "fp32"), _weights(tmp_path / "bf16")
    assert all(tensor.dtype == torch.float32 for tensor in mixed.values())
    assert any(not torch.equal(mixed[k], full[k]) for k in full)  # the bf16 forward changed the numbers...
    for key in full:  # ...but not the training: 4 steps at lr 1e-4 land next to the fp32 weights
        torch.testing.assert_close(mixed[key], full[key], rtol=0, atol=1e-3, msg=key)
    for a, b in zip(_metrics(tmp_path / "fp32"), _metrics(tmp_path / "bf16"), strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp", "fsdp2", "deepspeed-zero2"])
def test_bf16_two_processes_match_one_process(tmp_path, one_process, data_dirs, fresh_weights, backend) -> None:
    # bf16 products depend on how a batch is split, so the tolerance is bf16 against fp32's (above)
    _two_processes_match_one(
        tmp_path, one_process, data_dirs, fresh_weights, "sft", SFT, BF16, backend=backend, atol=1e-3, rel=0.02
    )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Callable[[StageSpec], tuple[DoneEvent, Path]]:
    """Runs a one-process stage once per configuration: the layouts compared against it share the run."""
    done: dict[str, tuple[DoneEvent, Path]] = {}

    def run(spec: StageSpec) -> tuple[DoneEvent, Path]:
        key = json.dumps(spec.config, sort_keys=True)
        if key not in done:
            out = tmp_path_factory.mktemp("one-process")
            done[key] = run_training(replace(spec, output_dir=str(out))), out
        return done[key]

    return run


def _two_processes_match_one(
    tmp_path, one_process, data_dirs, fresh_weights, trainer, train, stage, *, backend: str, atol=1e-5, rel=1e-3
) -> None:
    """Live and EMA weights within ``atol`` (and rtol 1e-4), every logged metric within ``rel``."""
    single, single_out = one_process(_spec(tmp_path / "one", data_dirs, trainer, train, 1, **stage))
    double = run_training(_spec(tmp_path / "two", data_dirs, trainer, train, 2, backend, **stage))
    assert (single.ranks, double.ranks) == (1, 2)  # replicated ranks end only if they agree bit for bit
    assert double.progress == single.progress
    assert sorted(p.name for p in (tmp_path / "two" / "logs").glob("rank-*.log")) == ["rank-0.log", "rank-1.log"]
    for kind in ("live", "ema"):
        one, two = _weights(single_out, kind), _weights(tmp_path / "two", kind)
        assert one.keys() == two.keys()
        for key in one:
            torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=atol, msg=f"{kind} {key}")
    trained = _weights(tmp_path / "two")
    assert any(not torch.equal(trained[k], v) for k, v in fresh_weights.items() if k in trained)
    for a, b in zip(_metrics(single_out), _metrics(tmp_path / "two"), strict=True):
        extra = b.keys() - a.keys()  # under ddp the all-reduce's seconds (per role: <role>/grad_sync_seconds)
        assert {key.rsplit("/", 1)[-1] for key in extra} == ({"grad_sync_seconds"} if backend == "ddp" else set())
        assert a.keys() <= b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=rel, abs=1e-5), key


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["grpo-guard", "dppo", "mixgrpo", "nft", "awm", "online-dpo", "dgpo", "crd"])
def test_ddp_every_online_trainer_matches_one_process(tmp_path, one_process, data_dirs, fresh_weights, trainer) -> None:
    timesteps = ("awm", "dgpo", "crd")
    train = {**GRPO, "train_timesteps": 2} if trainer in timesteps else GRPO  # 4 sampling steps allow 2
    train = {**train, "shift_interval": 1} if trainer == "mixgrpo" else train  # its window moves every iteration
    sampling = {"steps": 4, "window": 2} if trainer == "mixgrpo" else {"steps": 4}
    sampling = {**sampling, "dynamics": "ode"} if trainer == "dgpo" else sampling  # dgpo samples with the ODE
    stage = {"sampling": sampling, "rewards": [{"name": "jpeg_incompressibility"}]}
    _two_processes_match_one(tmp_path, one_process, data_dirs, fresh_weights, trainer, train, stage, backend="ddp")


def scores_refusing_group(group: int):  # noqa: ANN201
    """Scores every sample by its prompt length, but answers 400 for batches holding ``group``."""

    def answer(request: dict) -> tuple[int, dict]:
        if any(m["group_id"] == group for m in request["metadata"]):
            return 400, {"error": f"group {group} is not scored here"}
        return 200, {"scores": [float(len(p)) for p in request["prompts"]]}

    return answer


def test_ddp_a_failing_rank_fails_the_stage_naming_that_rank(tmp_path, data_dirs, json_server) -> None:
    # Iteration 0 has groups 0 and 1; with 2 ranks group 1 lives on rank 1 only.
    with json_server(scores_refusing_group(1)) as url:
        reward = {"name": "remote", "options": {"url": url, "retries": 0}}
        spec = _spec(tmp_path / "bad", data_dirs, "grpo", GRPO, 2, sampling={"steps": 3}, rewards=[reward])
        with pytest.raises(FlowpostError, match=r"rank 1 failed.*: .*group 1 is not scored here") as failure:
            run_training(spec)
    assert "rank-1.log" in str(failure.value.where)
    assert not (tmp_path / "bad" / "final").exists()


def _rank_pid(spec_path: Path, rank: int) -> int:
    """The process running stage rank ``rank`` of the stage whose spec is ``spec_path``."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(spec_path) in cmdline.read_bytes().decode(errors="replace"):
                if f"\0RANK={rank}\0".encode() in b"\0" + (cmdline.parent / "environ").read_bytes():
                    return int(cmdline.parent.name)
        except OSError:
            continue
    raise AssertionError(f"no process runs rank {rank} of {spec_path}")


def test_ddp_a_rank_killed_by_a_signal_is_named_before_the_peers_it_disconnected(
    tmp_path, data_dirs, json_server
) -> None:
    out = tmp_path / "killed"

    def kill_rank_one_at_group_one(request: dict) -> tuple[int, dict]:
        if any(m["group_id"] == 1 for m in request["metadata"]):  # only rank 1 scores group 1
            os.kill(_rank_pid(out / "stage.json", 1), signal.SIGKILL)  # as a native abort would end it
            return 503, {"error": "the rank is gone"}
        return 200, {"scores": [float(len(p)) for p in request["prompts"]]}

    with json_server(kill_rank_one_at_group_one) as url:
        reward = {"name": "remote", "options": {"url": url, "retries": 0}}
        spec = _spec(out, data_dirs, "grpo", GRPO, 2, sampling={"steps": 3}, rewards=[reward])
        with pytest.raises(FlowpostError, match=r"rank 1 failed.*: killed by SIGKILL \(no Python error") as failure:
            run_training(spec)
    assert "rank-1.log" in str(failure.value.where)
    assert not (out / "final").exists()


# One SFT stage resumed under a new world size or layout at every link: 2 optimizer steps each.
RESUME_CHAIN = [(1, "ddp"), (2, "deepspeed-zero2"), (2, "fsdp2"), (2, "ddp"), (1, "ddp")]


@pytest.mark.slow
def test_resume_under_another_world_size_or_backend_warns_and_continues(tmp_path, data_dirs) -> None:
    steps = 2 * len(RESUME_CHAIN)
    straight = run_training(_spec(tmp_path / "straight", data_dirs, "sft", {**SFT, "max_steps": steps}, 1))
    out = tmp_path / "changed"
    for link, (processes, backend) in enumerate(RESUME_CHAIN, start=1):
        done = run_training(_spec(out, data_dirs, "sft", {**SFT, "max_steps": 2 * link}, processes, backend))
        start = [e for e in read_events(out / "events.jsonl") if e["event"] == "start"][-1]
        if link == 1:
            assert start["resumed_from"] is None
            continue
        ranks_before, backend_before = RESUME_CHAIN[link - 2]
        layout_before = backend_before if ranks_before > 1 else "ddp"  # one process runs unwrapped
        assert start["resumed_from"] is not None and start["step"] == 2 * (link - 1), link
        assert (start["ranks"], start["resumed_with_ranks_from"]) == (processes, ranks_before), link
        assert start["resumed_with_layout_from"] == layout_before, link
    assert done.progress == straight.progress
    expected, actual = _weights(tmp_path / "straight"), _weights(out)
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-5, msg=key)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_multinode_two_launchers_on_loopback_form_one_four_rank_job(tmp_path, data_dirs) -> None:
    train = {**SFT, "batch_size": 8}
    single = run_training(_spec(tmp_path / "one", data_dirs, "sft", train, 1))
    out = tmp_path / "four"
    spec = _spec(out, data_dirs, "sft", train, 4)
    (out / "logs").mkdir(parents=True)
    spec.write(out / "stage.json")
    port = str(_free_port())
    machines = []
    for machine in (0, 1):
        topology = Topology(num_machines=2, machine_rank=machine, main_process_port=int(port)).to_env()
        with (out / "logs" / f"machine-{machine}.log").open("w") as log:
            machines.append(
                subprocess.Popen(
                    [sys.executable, "-m", "flowpost.stage", str(out / "stage.json")],
                    env={**os.environ, **topology, "OMP_NUM_THREADS": "1"},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    codes = [machine.wait(timeout=600) for machine in machines]
    assert codes == [0, 0], (out / "logs" / "machine-0.log").read_text()[-2000:]
    done = [e for e in read_events(out / "events.jsonl") if e["event"] == "done"][-1]
    assert done["ranks"] == 4 and done["progress"] == single.progress
    assert sorted(p.name for p in (out / "logs").glob("rank-*.log")) == [f"rank-{r}.log" for r in range(4)]
    expected, actual = _weights(tmp_path / "one"), _weights(out)
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-5, msg=key)


def _wait_until_gone(marker: str, timeout: float = 60.0) -> None:
    """Block until no process has ``marker`` on its command line."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if marker in cmdline.read_bytes().decode(errors="replace"):
                    alive.append(cmdline.parent.name)
            except OSError:
                continue
        if not alive:
            return
        assert time.monotonic() < deadline, f"processes {alive} outlived their launcher"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("processes", "backend"),
    [(1, "ddp"), (2, "ddp"), (2, "fsdp2"), (2, "deepspeed-zero2")],
    ids=["one-process", "ddp", "fsdp2", "deepspeed-zero2"],
)
def test_resume_grpo_after_sigkill_mid_iteration_is_bit_identical(tmp_path, data_dirs, processes, backend) -> None:
    train = {**GRPO, "lr": 1e-3, "iterations": 16, "checkpoint_every": 1}
    stage = {"sampling": {"steps": 4}, "rewards": [{"name": "jpeg_incompressibility"}]}
    run_training(_spec(tmp_path / "straight", data_dirs, "grpo", train, processes, backend, **stage))

    killed = tmp_path / "killed"
    killed.mkdir()
    spec = _spec(killed, data_dirs, "grpo", train, processes, backend, **stage)
    spec.write(killed / "stage.json")
    process = subprocess.Popen(
        [sys.executable, "-m", "flowpost.stage", str(killed / "stage.json")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": str(threads_per_process(spec))},  # as run_training sets it
    )
    deadline = time.monotonic() + 300
    while not any(e["event"] == "checkpoint" and e["step"] >= 2 for e in read_events(killed / "events.jsonl")):
        assert process.poll() is None and time.monotonic() < deadline, "stage ended before it could be killed"
        time.sleep(0.02)
    time.sleep(0.05)  # into the next iteration's rollout or update
    os.killpg(process.pid, signal.SIGKILL)  # the ranks follow their launcher (parent-death signal)
    process.wait()
    _wait_until_gone(str(killed / "stage.json"))  # cancelling leaves no rank behind
    assert not (killed / "final").exists()

    done = run_training(_spec(killed, data_dirs, "grpo", train, processes, backend, **stage))
    assert done.progress["rollout_iteration"] == 16
    start = [e for e in read_events(killed / "events.jsonl") if e["event"] == "start"][-1]
    assert start["resumed_from"] is not None and start["step"] >= 2
    for kind in ("live", "ema"):
        expected, actual = _weights(tmp_path / "straight", kind), _weights(killed, kind)
        assert expected.keys() == actual.keys()
        assert all(torch.equal(expected[key], actual[key]) for key in expected), kind


@pytest.mark.slow  # about 40 s a layout: two ranks loading and training a pipeline folder
@pytest.mark.parametrize("backend", ["ddp", "fsdp2", "deepspeed-zero2"])
def test_lora_on_a_bf16_base_keeps_fp32_adapters_and_moments_on_two_processes(
    tmp_path, sd3_pipeline_dir, sd3_data_dirs, backend
) -> None:
    from flowpost.core.checkpoint import load_checkpoint

    model = {"family": "sd3", "pretrained": str(sd3_pipeline_dir), "torch_dtype": "bfloat16", "lora": {"rank": 4}}
    train = {**SFT, "lr": 1e-5, "checkpoint_every": 2, "keep_last": 2}
    run_training(_spec(tmp_path, sd3_data_dirs, "sft", train, 2, backend, model=model))
    early, late = (load_checkpoint(tmp_path / "checkpoints" / f"step-{n}") for n in (2, 4))
    lora = {k: v for k, v in late.model.items() if "lora_" in k}
    assert lora and all(v.dtype == torch.float32 for v in lora.values())
    moments = [m for s in late.optimizer["state"].values() for m in (s["exp_avg"], s["exp_avg_sq"])]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    lora_a = [k for k in lora if "lora_A" in k]
    moved = sum(int((late.model[k] != early.model[k]).sum()) for k in lora_a)
    assert moved > 0.5 * sum(late.model[k].numel() for k in lora_a)  # two more steps of lr 1e-5 moved A
