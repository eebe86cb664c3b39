"""A run rewarded by a token-protected server leaves the token in no file it writes."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

TOKEN_ENV = "FLOWPOST_TEST_REWARD_TOKEN"


@contextmanager
def token_server(token: str) -> Iterator[tuple[str, list[str]]]:
    """A reward server requiring ``Bearer token``: ``GET /health`` and ``POST /score`` (scores by prompt length)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: dict[str, Any]) -> None:
            authorization = self.headers.get("Authorization", "")
            seen.append(authorization)
            status = 200 if authorization == f"Bearer {token}" else 401
            data = json.dumps(body if status == 200 else {"error": "missing or wrong bearer token"}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer({"version": "v1"})

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._answer({"scores": [len(prompt) / 30.0 for prompt in request["prompts"]]})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/score", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _pipeline(tiny: dict[str, Any], url: str) -> dict[str, Any]:
    """The tiny SFT pipeline plus a GRPO stage on the remote reward; trackers write event files."""
    trackers = {"trackers": ["tensorboard", "dvclive"]}
    tiny["stages"]["sft"]["callbacks"] |= trackers
    tiny["stages"]["grpo"] = {
        "trainer": "grpo",
        "model": {"init": "sft", "transformer": tiny["stages"]["sft"]["model"]["transformer"]},
        "data": {"dataset": "digits", "conditions": "minilm"},
        "sampling": {"steps": 3},
        "rewards": [{"name": "remote", "options": {"url": url, "token_env": TOKEN_ENV, "retries": 0}}],
        "train": {
            "iterations": 2,
            "prompts_per_iteration": 2,
            "group_size": 4,
            "rollout_batch_size": 8,
            "train_batch_size": 8,
        },
        "callbacks": trackers,
    }
    tiny["evaluate"]["after"] = ["sft", "grpo"]
    tiny["export"] = {"from": "grpo"}
    return tiny


def _holding(root: Path, needles: list[bytes]) -> list[str]:
    """Files under ``root`` (any depth, binary ones included) that contain one of ``needles``."""
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink() and any(n in path.read_bytes() for n in needles)
    )


@pytest.mark.slow
def test_a_run_with_a_reward_server_token_writes_the_token_nowhere(tmp_path: Path, tiny_pipeline) -> None:
    token = secrets.token_urlsafe(24)
    needles = [token.encode(), base64.b64encode(token.encode()), base64.b64encode(f"Bearer {token}".encode())]
    env = {**os.environ, TOKEN_ENV: token, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("PREFECT_API_URL", None)  # the run starts its own temporary server, whose database is under PREFECT_HOME
    flowpost = [sys.executable, "-m", "flowpost.cli"]
    with token_server(token) as (url, seen):
        (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(_pipeline(tiny_pipeline(), url), sort_keys=False))
        run = subprocess.run(
            [*flowpost, "run", "pipeline.yaml", "--workspace", "ws"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            timeout=900,
        )
        assert run.returncode == 0, (run.stdout + run.stderr).decode(errors="replace")[-3000:]
        for command in (["plan", "pipeline.yaml", "--workspace", "ws"], ["dvc", "sync", "pipeline.yaml"]):
            done = subprocess.run([*flowpost, *command], cwd=tmp_path, env=env, capture_output=True, timeout=300)
            assert done.returncode == 0, done.stderr.decode(errors="replace")
            assert not any(n in done.stdout + done.stderr for n in needles)
    assert len(seen) >= 3 and set(seen) == {f"Bearer {token}"}  # health check and two scored iterations, all with it

    assert not any(n in run.stdout + run.stderr for n in needles)
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    names = {path.name for path in written}
    assert {"events.jsonl", "params.yaml", "dvc.yaml", "report.md", "metrics.json"} <= names
    assert any(name.startswith("events.out.tfevents") for name in names)  # tensorboard event files
    assert any(path.parent.name == "dvclive" or "dvclive" in path.parts for path in written)
    # the Prefect database (runs, logs, artifacts) holds the run: its config names the token's variable
    assert _holding(tmp_path / "prefect-home", [TOKEN_ENV.encode()])
    assert _holding(tmp_path, needles) == []
