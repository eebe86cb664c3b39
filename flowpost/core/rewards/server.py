"""Serve any reward over HTTP for ``RemoteReward``: a FastAPI app run by uvicorn.

``POST /score`` takes ``{"prompts": [str], "metadata": [object], "images": [base64 image]}`` (one
entry per sample; PNG or JPEG, all the same size, grayscale or RGB) and answers
``{"scores": [float]}``. ``GET /health`` answers ``{"ok": true, "reward": NAME, "version": VERSION}``
without a token; clients fingerprint the version, so changing it reruns what the reward trained.
Errors are JSON ``{"error": MESSAGE}``: 400 for bad requests (including inputs the reward refuses,
such as a label out of range), 401 for a missing or wrong token, 413 for a body or batch over the
server's ``Limits``, 500 when the reward itself fails, 503 when more requests are open than the
server holds.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from flowpost.core.io import sha256_json
from flowpost.core.rewards.base import Reward
from flowpost.core.rewards.registry import build_reward
from flowpost.core.rewards.score_app import Limits, score_app
from flowpost.errors import FlowpostError

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 10.0


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RewardServer:
    """One reward behind uvicorn on a socket bound at construction (so its port is known at once)."""

    def __init__(self, reward: Reward, sock: socket.socket, *, token: str | None, version: str, limits: Limits) -> None:
        self.reward = reward
        self.version = version
        self.socket = sock
        host, self.port = sock.getsockname()[:2]
        self.url = f"http://{host}:{self.port}/score"  # the scoring endpoint
        app = score_app(reward, token=token, version=version, limits=limits)
        config = uvicorn.Config(
            app,
            log_level="warning",
            limit_concurrency=limits.max_open_requests,
            timeout_keep_alive=60,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)

    def serve_until_interrupted(self) -> None:
        """Answer requests in the foreground until SIGINT or SIGTERM, then close the socket."""
        try:
            self._server.run(sockets=[self.socket])
        finally:
            self.close()

    @contextlib.contextmanager
    def running(self) -> Iterator[RewardServer]:
        """Answer requests from a background thread while the block runs; stop and close after it."""
        thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise FlowpostError("the reward server did not start", where=self.url)
            time.sleep(0.01)
        try:
            yield self
        finally:
            self._server.should_exit = True
            thread.join(STARTUP_TIMEOUT_S)
            self.close()

    def close(self) -> None:
        """Close the listening socket (idempotent)."""
        self.socket.close()


def serve_reward(
    reward: Reward,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    version: str | None = None,
    limits: Limits | None = None,
) -> RewardServer:
    """A bound server for ``reward`` (port 0: any free port); ``running()`` or
    ``serve_until_interrupted()`` answers requests.

    With ``token``, ``POST /score`` requires ``Authorization: Bearer <token>``; a ``host`` other than
    loopback requires a token. ``version`` (default: the reward's name) is what ``GET /health``
    reports as the model version.
    """
    if token is None and not is_loopback(host):
        raise FlowpostError(
            f"listening on {host or 'every interface'} lets other machines score with this reward; require a "
            "bearer token (--token-env VARIABLE) or listen on 127.0.0.1",
            where="reward server",
        )
    try:
        sock = socket.create_server((host, port), family=_family(host))
    except OSError as exc:
        raise FlowpostError(f"cannot listen on {host}:{port} ({exc})", where="reward server") from None
    return RewardServer(reward, sock, token=token, version=version or reward.name, limits=limits or Limits())


def _family(host: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET


def serve_registered_reward(
    name: str,
    options: dict[str, Any],
    *,
    host: str,
    port: int,
    token: str | None = None,
    version: str | None = None,
    limits: Limits | None = None,
    where: str = "reward server",
) -> RewardServer:
    """A bound server for the registered reward ``name`` built with ``options``.

    ``version`` defaults to a hash of the name and options, so serving other options reads as
    another model version to the stages that fingerprint it.
    """
    version = version or sha256_json({"reward": name, "options": options})[:12]
    return serve_reward(
        build_reward(name, options=options, where=where),
        host=host,
        port=port,
        token=token,
        version=version,
        limits=limits,
    )
