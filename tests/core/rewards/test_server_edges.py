"""What the reward server refuses, and how: 400/413 with a message the client quotes, never retried."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from typer.testing import CliRunner

from flowpost.cli import app
from flowpost.core.rewards.remote import RemoteReward, encode_images
from flowpost.core.rewards.server import Limits, serve_reward
from flowpost.errors import FlowpostError
from flowpost_digits.classifier import REWARD_CLASSIFIER, DigitClassifier, save_classifier
from flowpost_digits.reward import DigitAdherence


class Counting:
    """Scores 1.0 per sample and counts its calls."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        self.calls += 1
        return torch.ones(media.shape[0])


@pytest.fixture
def digits(tmp_path: Path) -> DigitAdherence:
    torch.manual_seed(0)
    save_classifier(DigitClassifier(width=REWARD_CLASSIFIER.width), tmp_path, REWARD_CLASSIFIER.name)
    return DigitAdherence(tmp_path)


def _post(url: str, payload: dict[str, Any]) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)["error"]


@pytest.mark.parametrize(
    ("media", "label", "match"),
    [
        (torch.rand(2, 1, 16, 16), 10, "label 10 is out of range; digits are 0-9"),
        (torch.rand(2, 1, 16, 16), 1.9, "label 1.9 is not an integer"),
        (torch.rand(2, 1, 16, 16), True, "label True is a boolean, not an integer"),
        (torch.rand(2, 3, 16, 16), 1, r"grayscale 16x16 images \[B, 1, 16, 16\], got \(2, 3, 16, 16\)"),
        (torch.rand(2, 1, 20, 20), 1, r"got \(2, 1, 20, 20\)"),
    ],
)
def test_bad_labels_and_images_are_400s_the_client_quotes_without_retrying(
    digits: DigitAdherence, media: Tensor, label: Any, match: str
) -> None:
    calls = []

    class Counted:
        name = digits.name

        def __call__(self, *batch: Any) -> Tensor:
            calls.append(1)
            return digits(*batch)

    with serve_reward(Counted()).running() as server:
        with pytest.raises(FlowpostError, match=f"HTTP 400 Bad Request: rewards: digit_adherence .*{match}"):
            RemoteReward(server.url, retries=3, backoff=0)(media, ["a", "b"], [{"label": label}] * 2)
    assert len(calls) == 1


def test_bodies_and_batches_over_the_limits_are_413s() -> None:
    reward = Counting()
    images = encode_images(torch.rand(3, 1, 8, 8))
    payload = {"prompts": ["a"] * 3, "metadata": [{}] * 3, "images": images}
    small_body = Limits(max_body_bytes=len(json.dumps(payload)) - 1)
    with serve_reward(reward, limits=small_body).running() as server:
        status, message = _post(server.url, payload)
        assert status == 413 and message.startswith("request body of ")
        assert "over this server's limit" in message and "--max-body-mb" in message
        with pytest.raises(FlowpostError, match="HTTP 413 .*over this server's limit"):
            RemoteReward(server.url, retries=2, backoff=0)(torch.rand(3, 1, 8, 8), ["a"] * 3, [{}] * 3)
    with serve_reward(reward, limits=Limits(max_batch=2)).running() as server:
        status, message = _post(server.url, payload)
        assert (status, message) == (
            413,
            "a batch of 3 images is over this server's limit of 2; send smaller batches or start the server "
            "with a larger --max-batch",
        )
        assert _post(server.url, {**payload, "prompts": ["a"] * 2, "metadata": [{}] * 2, "images": images[:2]}) == (
            200,
            "",
        )
    assert reward.calls == 1


@pytest.mark.parametrize("host", ["0.0.0.0", "", "example.invalid"])
def test_listening_beyond_loopback_needs_a_token(host: str) -> None:
    with pytest.raises(FlowpostError, match="require a bearer token .*or listen on 127.0.0.1"):
        serve_reward(Counting(), host=host)


def test_the_cli_refuses_a_public_address_without_a_token() -> None:
    result = CliRunner().invoke(app, ["reward-server", "jpeg_incompressibility", "--host", "0.0.0.0", "--port", "0"])
    assert isinstance(result.exception, FlowpostError)
    assert "listening on 0.0.0.0 lets other machines score" in str(result.exception)


class EchoIds:
    name = "echo-ids"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        return torch.tensor([float(m["id"]) for m in metadata])


def test_concurrent_clients_each_get_their_own_scores_once() -> None:
    from concurrent.futures import ThreadPoolExecutor

    media = torch.rand(2, 3, 8, 8)
    with serve_reward(EchoIds()).running() as server:

        def client(index: int) -> list[list[float]]:
            remote = RemoteReward(server.url, retries=0)
            return [
                remote(media, ["a", "b"], [{"id": 10 * index + r}, {"id": -10 * index - r}]).tolist() for r in range(3)
            ]

        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(client, range(6)))
    assert answers == [[[10.0 * i + r, -10.0 * i - r] for r in range(3)] for i in range(6)]


def test_a_streamed_body_over_the_limit_is_a_413() -> None:
    import httpx

    def chunks():  # noqa: ANN202 - no Content-Length: the server counts what arrives
        for _ in range(8):
            yield b" " * 1024

    with serve_reward(Counting(), limits=Limits(max_body_bytes=4096)).running() as server:
        answer = httpx.post(server.url, content=chunks(), timeout=10)
    assert answer.status_code == 413
    assert answer.json()["error"].startswith("request body of more than 4096 bytes is over this server's limit")
