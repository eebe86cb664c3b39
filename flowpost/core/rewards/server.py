"""Serve any reward over HTTP for ``RemoteReward``.

``POST /score`` takes ``{"prompts": [str], "metadata": [object], "images": [base64 image]}`` (one
entry per sample; PNG or JPEG, all the same size, grayscale or RGB) and answers
``{"scores": [float]}``. ``GET /health`` answers ``{"ok": true, "reward": NAME, "version": VERSION}``
without a token; clients fingerprint the version, so changing it reruns what the reward trained.
Errors are JSON ``{"error": MESSAGE}``: 400 for bad requests (including inputs the reward refuses,
such as a label out of range), 401 for a missing or wrong token, 413 for a body or batch over the
server's ``Limits``, 500 when the reward itself fails.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flowpost.core.io import sha256_json
from flowpost.core.rewards.base import Reward
from flowpost.core.rewards.registry import build_reward
from flowpost.core.rewards.score_request import BadRequest, parse_score_request
from flowpost.errors import FlowpostError

logger = logging.getLogger(__name__)


MIB = 1 << 20
_DRAIN_CHUNK = 1 << 16


@dataclass(frozen=True)
class Limits:
    """The largest ``POST /score`` body (bytes) and batch (images) the server accepts."""

    max_body_bytes: int = 256 * MIB
    max_batch: int = 1024


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RewardServer(ThreadingHTTPServer):
    """A threading HTTP server holding one reward; scoring calls are serialised by a lock."""

    def __init__(
        self, address: tuple[str, int], reward: Reward, token: str | None, version: str, limits: Limits
    ) -> None:
        super().__init__(address, RewardHandler)
        self.reward = reward
        self.token = token
        self.version = version
        self.limits = limits
        self.score_lock = threading.Lock()

    def serve_until_interrupted(self) -> None:
        """Answer requests until Ctrl-C, then close the socket."""
        try:
            self.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.server_close()

    @property
    def url(self) -> str:
        """The scoring endpoint, e.g. ``http://127.0.0.1:8765/score``."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/score"


class RewardHandler(BaseHTTPRequestHandler):
    """Answers ``GET /health`` and ``POST /score`` for the server's reward."""

    server: RewardServer
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds a stalled client may hold a connection's socket read

    def do_GET(self) -> None:
        if self.path != "/health":
            self._answer(404, {"error": f"no such endpoint: GET {self.path}"})
            return
        self._answer(200, {"ok": True, "reward": self.server.reward.name, "version": self.server.version})

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._answer(400, {"error": "bad Content-Length header"})
            return
        limit = self.server.limits.max_body_bytes
        if length > limit:
            self._drain(length)
            message = (
                f"request body of {length} bytes is over this server's limit of {limit} bytes; send smaller "
                "batches or start the server with a larger --max-body-mb"
            )
            self._answer(413, {"error": message})
            return
        body = self.rfile.read(length)
        if self.path != "/score":
            self._answer(404, {"error": f"no such endpoint: POST {self.path}"})
            return
        if not self._authorised():
            self._answer(401, {"error": "missing or wrong bearer token"}, {"WWW-Authenticate": "Bearer"})
            return
        try:
            request = parse_score_request(body, max_batch=self.server.limits.max_batch)
            with self.server.score_lock:
                scores = self.server.reward(request.media, request.prompts, request.metadata)
        except BadRequest as exc:
            self._answer(exc.status, {"error": str(exc)})
            return
        except FlowpostError as exc:
            self._answer(400, {"error": str(exc)})
            return
        except Exception:
            logger.exception("reward %s failed", self.server.reward.name)
            self._answer(500, {"error": f"reward {self.server.reward.name!r} failed; see the server log"})
            return
        batch = request.media.shape[0]
        if scores.shape != (batch,):
            self._answer(500, {"error": f"reward returned shape {tuple(scores.shape)}, expected ({batch},)"})
            return
        self._answer(200, {"scores": scores.detach().float().cpu().tolist()})

    def _drain(self, length: int) -> None:
        """Read and discard ``length`` body bytes, so the client reads the answer instead of a reset."""
        while length > 0 and (chunk := self.rfile.read(min(length, _DRAIN_CHUNK))):
            length -= len(chunk)

    def _authorised(self) -> bool:
        if self.server.token is None:
            return True
        expected = f"Bearer {self.server.token}".encode()
        return hmac.compare_digest(self.headers.get("Authorization", "").encode(), expected)

    def _answer(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        logger.info("%s %s", self.address_string(), format % args)


def serve_reward(
    reward: Reward,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    version: str | None = None,
    limits: Limits | None = None,
) -> RewardServer:
    """A bound server for ``reward`` (port 0: any free port); run ``serve_forever()`` to answer requests.

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
        return RewardServer((host, port), reward, token, version or reward.name, limits or Limits())
    except OSError as exc:
        raise FlowpostError(f"cannot listen on {host}:{port} ({exc})", where="reward server") from None


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
