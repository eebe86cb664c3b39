"""A reward server that echoes the request's bearer token back never puts it into a flowpost error."""

from __future__ import annotations

import json

import pytest
import torch
from http_servers import scripted

from flowpost.core.rewards.remote import RemoteReward
from flowpost.errors import FlowpostError, TransientError

TOKEN = "echoed-secret-token-4f1c"
ECHO = f"Authorization: Bearer {TOKEN}"


@pytest.mark.parametrize(
    ("status", "body", "error", "said"),
    [
        (401, json.dumps({"error": f"rejected {ECHO}"}), FlowpostError, "HTTP 401"),
        (503, json.dumps({"error": f"busy, {ECHO}"}), TransientError, "last error: HTTP 503"),
        (200, f"<html>{ECHO}</html>", FlowpostError, "answered non-JSON"),
        (200, json.dumps({"echo": ECHO}), FlowpostError, 'has no "scores"'),
        (200, json.dumps({"scores": [ECHO]}), FlowpostError, "score 0 is"),
    ],
)
def test_server_text_in_an_error_has_the_token_masked(
    status: int, body: str, error: type[FlowpostError], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWPOST_TEST_TOKEN", TOKEN)
    with scripted([(status, body.encode(), 0.0)]) as (url, seen):
        reward = RemoteReward(url, token_env="FLOWPOST_TEST_TOKEN", retries=1, backoff=0)
        with pytest.raises(error) as info:
            reward(torch.zeros(1, 1, 4, 4), ["a"], [{}])
    message = str(info.value)
    assert seen and set(seen) == {f"Bearer {TOKEN}"}  # the token was sent, and came back
    assert said in message and "Authorization: Bearer [token]" in message and TOKEN not in message
