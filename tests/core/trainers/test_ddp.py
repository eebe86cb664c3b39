"""Two-process data parallelism (torchrun, gloo on CPU) through the real stage launch path."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from flowpost.core.events import read_events
from flowpost.core.trainers.spec import StageSpec
from flowpost.errors import FlowpostError
from flowpost.tasks.train import run_training

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
    out: Path, data_dirs: tuple[Path, Path], trainer: str, train: dict, processes: int, **stage: Any
) -> StageSpec:
    dataset_dir, conditions_dir = data_dirs
    config = {
        "trainer": trainer,
        "model": {"family": "tiny-sd3", "transformer": TINY},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "train": train,
        "callbacks": {"ema": {"decay": 0.9}, "grad_clip": {"max_norm": 1.0}},
        "launch": {"num_processes": processes, "hang_timeout": 300},
        **stage,
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
    return [e["metrics"] for e in read_events(out / "events.jsonl") if e["event"] == "step"]


@pytest.mark.parametrize(
    ("trainer", "train", "stage"),
    [
        ("sft", SFT, {}),
        ("grpo", GRPO, {"sampling": {"steps": 4}, "rewards": [{"name": "jpeg_incompressibility"}]}),
    ],
)
def test_ddp_two_processes_match_one_process_with_the_same_global_batch(
    tmp_path, data_dirs, fresh_weights, trainer, train, stage
) -> None:
    single = run_training(_spec(tmp_path / "one", data_dirs, trainer, train, 1, **stage))
    double = run_training(_spec(tmp_path / "two", data_dirs, trainer, train, 2, **stage))
    assert (single["ranks"], double["ranks"]) == (1, 2)  # a 2-rank run ends only if both ranks agree bit for bit
    assert double["progress"] == single["progress"]
    assert sorted(p.name for p in (tmp_path / "two" / "logs").glob("rank-*.log")) == ["rank-0.log", "rank-1.log"]
    for kind in ("live", "ema"):
        one, two = _weights(tmp_path / "one", kind), _weights(tmp_path / "two", kind)
        assert one.keys() == two.keys()
        for key in one:
            torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5, msg=f"{kind} {key}")
    trained = _weights(tmp_path / "two")
    assert any(not torch.equal(trained[k], v) for k, v in fresh_weights.items() if k in trained)
    for a, b in zip(_metrics(tmp_path / "one"), _metrics(tmp_path / "two"), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-5), key


@contextmanager
def reward_server_refusing_group(group: int) -> Iterator[str]:
    """Scores every sample by its prompt length, but answers 400 for batches holding ``group``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if any(m["group_id"] == group for m in request["metadata"]):
                status, body = 400, {"error": f"group {group} is not scored here"}
            else:
                status, body = 200, {"scores": [float(len(p)) for p in request["prompts"]]}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/score"
    finally:
        server.shutdown()
        server.server_close()


def test_ddp_a_failing_rank_fails_the_stage_naming_that_rank(tmp_path, data_dirs) -> None:
    # Iteration 0 has groups 0 and 1; with 2 ranks group 1 lives on rank 1 only.
    with reward_server_refusing_group(1) as url:
        reward = {"name": "remote", "options": {"url": url, "retries": 0}}
        spec = _spec(tmp_path / "bad", data_dirs, "grpo", GRPO, 2, sampling={"steps": 3}, rewards=[reward])
        with pytest.raises(FlowpostError, match=r"rank 1 failed.*: .*group 1 is not scored here") as failure:
            run_training(spec)
    assert "rank-1.log" in str(failure.value.where)
    assert not (tmp_path / "bad" / "final").exists()
