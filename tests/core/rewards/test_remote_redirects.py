"""Scoring never follows redirects, so the bearer token never reaches another origin."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch
from http_servers import running, scripted

from flowpost.core.rewards.remote import RemoteReward
from flowpost.errors import FlowpostError

TOKEN = "redirect-test-token"


def _redirector(status: int, location: str) -> ThreadingHTTPServer:
    """A server answering every request with ``status`` and ``Location: location``."""

    class Handler(BaseHTTPRequestHandler):
        def _redirect(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _redirect

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_an_error_naming_its_target_and_the_token_stays_home(
    status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWPOST_TEST_TOKEN", TOKEN)
    with scripted([(200, b'{"scores": [1.0]}', 0.0)]) as (elsewhere, seen):
        target = elsewhere.replace("127.0.0.1", "localhost") + "?key=hunter2"
        with running(_redirector(status, target)) as server:
            url = f"http://127.0.0.1:{server.server_address[1]}/score"
            reward = RemoteReward(url, token_env="FLOWPOST_TEST_TOKEN", retries=2, backoff=0)
            with pytest.raises(FlowpostError) as info:
                reward(torch.zeros(1, 1, 4, 4), ["a"], [{}])
            with pytest.raises(FlowpostError, match="redirected"):
                reward.served_version()
    message = str(info.value)
    assert f"reward server redirected (HTTP {status}) to {target.split('?')[0]}" in message
    assert "redirects are not followed" in message and "hunter2" not in message and TOKEN not in message
    assert seen == []
