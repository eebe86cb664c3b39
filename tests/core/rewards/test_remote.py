from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import torch
from http_servers import scripted
from torch import Tensor
from typer.testing import CliRunner

from flowpost.cli import app
from flowpost.core.rewards.jpeg import JpegIncompressibility
from flowpost.core.rewards.registry import build_reward
from flowpost.core.rewards.remote import RemoteReward
from flowpost.core.rewards.server import serve_registered_reward, serve_reward
from flowpost.errors import FlowpostError

TOKEN = "s3cret-token-value"


class Echo:
    """len(prompt) + metadata["label"]: shows that prompts and metadata reach the served reward."""

    name = "echo"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        return torch.tensor([len(p) + m["label"] for p, m in zip(prompts, metadata, strict=True)], dtype=torch.float32)


class Picky:
    name = "picky"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        raise FlowpostError("picky needs metadata['label'] for every sample", where="rewards")


def _media(channels: int, batch: int = 4) -> Tensor:
    return torch.rand(batch, channels, 16, 12, generator=torch.Generator().manual_seed(channels))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("channels", [1, 3])
def test_served_jpeg_reward_matches_the_local_one_on_uint8_pixels(channels: int) -> None:
    media = _media(channels)
    quantised = (media * 255).round() / 255
    local = JpegIncompressibility()(quantised, [""] * 4, [{}] * 4)
    with serve_reward(JpegIncompressibility()).running() as server:
        remote = RemoteReward(server.url, name="jpeg_remote")(media, ["a", "b", "c", "d"], [{}] * 4)
    assert remote.dtype == torch.float32 and remote.shape == (4,)
    assert torch.equal(remote, local)


def test_prompts_and_metadata_reach_the_served_reward() -> None:
    with serve_reward(Echo()).running() as server:
        scores = RemoteReward(server.url)(_media(3, 2), ["ab", "abcd"], [{"label": torch.tensor(1)}, {"label": 5}])
    assert scores.tolist() == [3.0, 9.0]


def test_health_and_bad_requests_answer_json() -> None:
    with serve_reward(Echo(), token=TOKEN).running() as server:
        base = server.url.removesuffix("/score")
        with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
            assert json.load(response) == {"ok": True, "reward": "echo", "version": "echo"}  # default: the name
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for body, status, match in [
            (b"not json", 400, "not JSON"),
            (b'{"prompts": ["a"], "images": ["%%%"]}', 400, "images[0]"),
            (b'{"prompts": ["a"], "images": []}', 400, "non-empty"),
        ]:
            request = urllib.request.Request(server.url, data=body, headers=auth, method="POST")
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(request, timeout=5)
            assert info.value.code == status and match in json.load(info.value)["error"]
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{base}/nothing", timeout=5)
        assert info.value.code == 404


def test_bad_batches_and_reward_errors_are_400s_with_the_server_message() -> None:
    with serve_reward(Echo()).running() as server:
        with pytest.raises(FlowpostError, match=r"HTTP 400.*\"prompts\" must be a list of 2 strings"):
            RemoteReward(server.url, retries=0)(_media(3, 2), ["only one"], [{}])
    with serve_reward(Picky()).running() as server:
        with pytest.raises(FlowpostError, match=r"HTTP 400.*picky needs metadata"):
            RemoteReward(server.url, backoff=0)(_media(3, 2), ["a", "b"], [{}, {}])


def test_bearer_token_is_read_from_the_environment_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWPOST_TEST_TOKEN", TOKEN)
    monkeypatch.setenv("FLOWPOST_TEST_WRONG", "wrong")
    media = _media(3, 2)
    with serve_reward(JpegIncompressibility(), token=TOKEN).running() as server:
        scores = RemoteReward(server.url, token_env="FLOWPOST_TEST_TOKEN")(media, ["a", "b"], [{}, {}])
        assert scores.shape == (2,)
        for token_env in (None, "FLOWPOST_TEST_WRONG"):
            with pytest.raises(FlowpostError, match="HTTP 401") as info:
                RemoteReward(server.url, token_env=token_env, backoff=0)(media, ["a", "b"], [{}, {}])
            assert TOKEN not in str(info.value)
    with scripted([(200, b'{"scores": [1, 2]}', 0.0)]) as (url, seen):
        RemoteReward(url, token_env="FLOWPOST_TEST_TOKEN")(media, ["a", "b"], [{}, {}])
        RemoteReward(url)(media, ["a", "b"], [{}, {}])
    assert seen == [f"Bearer {TOKEN}", ""]


def test_a_token_env_that_is_not_set_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWPOST_TEST_UNSET", raising=False)
    with pytest.raises(FlowpostError, match="environment variable FLOWPOST_TEST_UNSET .* is not set"):
        RemoteReward("http://127.0.0.1:1/score", token_env="FLOWPOST_TEST_UNSET")


def test_credentials_never_reach_errors() -> None:
    with pytest.raises(FlowpostError, match="must not contain credentials") as info:
        RemoteReward("http://user:hunter2@127.0.0.1:1/score")
    assert "hunter2" not in str(info.value)
    with scripted([(404, b"gone", 0.0)]) as (url, _):
        with pytest.raises(FlowpostError) as info:
            RemoteReward(f"{url}?key=hunter2")(_media(1, 1), ["a"], [{}])
    assert str(info.value).startswith(f"{url}: reward server answered HTTP 404") and "hunter2" not in str(info.value)


def test_timeouts_are_retried_then_reported() -> None:
    with scripted([(200, b'{"scores": [1.0]}', 0.6)]) as (url, seen):
        started = time.monotonic()
        with pytest.raises(FlowpostError, match=r"failed 3 attempts \(1 \+ 2 retries\); last error: .*timed out"):
            RemoteReward(url, timeout=0.15, retries=2, backoff=0.01)(_media(1, 1), ["a"], [{}])
        assert time.monotonic() - started < 2.0
    assert len(seen) == 3


def test_server_errors_are_retried_with_backoff() -> None:
    answers = [(500, b"busy", 0.0), (503, b"busy", 0.0), (200, b'{"scores": [0.5, 1.5]}', 0.0)]
    with scripted(answers) as (url, seen):
        started = time.monotonic()
        scores = RemoteReward(url, retries=3, backoff=0.05)(_media(3, 2), ["a", "b"], [{}, {}])
        assert time.monotonic() - started >= 0.05 + 0.1
    assert scores.tolist() == [0.5, 1.5] and len(seen) == 3
    with scripted([(500, b"still broken", 0.0)]) as (url, seen):
        with pytest.raises(FlowpostError, match=r"failed 2 attempts .*last error: HTTP 500.*still broken"):
            RemoteReward(url, retries=1, backoff=0)(_media(3, 2), ["a", "b"], [{}, {}])
    assert len(seen) == 2


def test_connection_refused_is_retried_then_reported() -> None:
    url = f"http://127.0.0.1:{_free_port()}/score"
    with pytest.raises(FlowpostError, match=r"failed 2 attempts .*ConnectError: .*refused"):
        RemoteReward(url, retries=1, backoff=0)(_media(1, 1), ["a"], [{}])


def test_client_errors_are_not_retried() -> None:
    with scripted([(422, b"x" * 300, 0.0)]) as (url, seen):
        with pytest.raises(FlowpostError, match="HTTP 422") as info:
            RemoteReward(url, retries=3)(_media(1, 1), ["a"], [{}])
    assert len(seen) == 1
    assert "x" * 200 in str(info.value) and "x" * 201 not in str(info.value)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"<html>oops</html>", "non-JSON: '<html>oops</html>'"),
        (b'{"score": [1, 2]}', 'no "scores"'),
        (b"[1, 2]", 'no "scores"'),
        (b'{"scores": [1.0]}', r'"scores" must be a list of 2 numbers, got 1 scores'),
        (b'{"scores": 3}', r'"scores" must be a list of 2 numbers, got int'),
        (b'{"scores": [1.0, NaN]}', "score 1 is nan; every score must be a finite number"),
        (b'{"scores": ["1", 2]}', "score 0 is '1'; every score must be a finite number"),
    ],
)
def test_malformed_answers_are_clear_errors(body: bytes, match: str) -> None:
    with scripted([(200, body, 0.0)]) as (url, seen):
        with pytest.raises(FlowpostError, match=match):
            RemoteReward(url)(_media(3, 2), ["a", "b"], [{}, {}])
    assert len(seen) == 1


def test_registered_as_remote() -> None:
    with serve_reward(JpegIncompressibility()).running() as server:
        reward = build_reward("remote", options={"url": server.url, "retries": 0}, where="stages.grpo.rewards.0")
        assert isinstance(reward, RemoteReward) and reward.name == "remote"
        assert reward(_media(3, 2), ["a", "b"], [{}, {}]).shape == (2,)
    with pytest.raises(FlowpostError, match="bad options for reward 'remote'"):
        build_reward("remote", options={"url": server.url, "token": TOKEN}, where="stages.grpo.rewards.0")


def test_cli_options_are_parsed_as_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    built: dict[str, Any] = {}

    class Stopped:
        url = "http://127.0.0.1:0/score"

        def __init__(self, version: str) -> None:
            self.version = version

        def serve_until_interrupted(self) -> None:
            built["closed"] = True

    def fake_serve(reward: RemoteReward, **kwargs: Any) -> Stopped:
        built.update(reward=reward, **kwargs)
        return Stopped(kwargs["version"])

    monkeypatch.setattr("flowpost.core.rewards.server.serve_reward", fake_serve)
    options = ["url=http://127.0.0.1:9/score", "retries=0", "timeout=2.5", "name=judge"]
    result = CliRunner().invoke(app, ["reward-server", "remote", *sum((["--option", o] for o in options), [])])
    assert result.exit_code == 0, result.output
    reward = built["reward"]
    assert (reward.retries, reward.timeout, reward.name) == (0, 2.5, "judge") and built["closed"]
    result = CliRunner().invoke(app, ["reward-server", "jpeg_incompressibility", "--option", "quality"])
    assert isinstance(result.exception, FlowpostError) and "must be KEY=VALUE" in str(result.exception)


def test_a_registered_reward_is_served_under_a_version_hashed_from_its_options() -> None:
    def version(options: dict[str, Any], given: str | None = None) -> str:
        server = serve_registered_reward("remote", options, host="127.0.0.1", port=0, version=given)
        server.close()
        return server.version

    url = {"url": "http://127.0.0.1:9/score"}
    assert version(url) == version(dict(url)) != version({**url, "retries": 0})
    assert version(url, "v3") == "v3"


def test_a_stopped_server_closes_its_socket() -> None:
    server = serve_reward(Echo())
    with server.running():
        assert RemoteReward(server.url)(_media(1, 1), ["a"], [{"label": 1}]).tolist() == [2.0]
    assert server.socket.fileno() == -1
    with pytest.raises(FlowpostError, match="failed 1 attempts"):
        RemoteReward(server.url, retries=0)(_media(1, 1), ["a"], [{"label": 1}])


def test_cli_reward_server_serves_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    env = {**os.environ, "FLOWPOST_TEST_TOKEN": TOKEN}
    command = [sys.executable, "-m", "flowpost.cli", "reward-server", "jpeg_incompressibility", "--version", "v3"]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--token-env", "FLOWPOST_TEST_TOKEN"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    assert json.load(response) == {"ok": True, "reward": "jpeg_incompressibility", "version": "v3"}
                break
            except (urllib.error.URLError, ConnectionError):
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "reward-server did not answer /health in 15 s"
                time.sleep(0.1)
        monkeypatch.setenv("FLOWPOST_TEST_TOKEN", TOKEN)
        media = _media(3, 2)
        remote = RemoteReward(f"http://127.0.0.1:{port}/score", token_env="FLOWPOST_TEST_TOKEN")
        assert torch.equal(
            remote(media, ["a", "b"], [{}, {}]), JpegIncompressibility()((media * 255).round() / 255, [], [])
        )
    finally:
        process.terminate()
        stdout, _ = process.communicate(timeout=10)
    assert f"http://127.0.0.1:{port}/score" in stdout and TOKEN not in stdout


def test_jpeg_transport_and_bad_formats() -> None:
    with serve_reward(Echo()).running() as server:
        scores = RemoteReward(server.url, image_format="jpeg")(_media(1, 2), ["a", "b"], [{"label": 0}, {"label": 1}])
    assert scores.tolist() == [1.0, 2.0]
    with pytest.raises(FlowpostError, match="image_format must be one of png, jpeg"):
        RemoteReward("http://127.0.0.1:1/score", image_format="gif")
