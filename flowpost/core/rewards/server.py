"""Serve any reward over HTTP for ``RemoteReward``.

``POST /score`` takes ``{"prompts": [str], "metadata": [object], "images": [base64 image]}`` (one
entry per sample; PNG or JPEG, all the same size, grayscale or RGB) and answers
``{"scores": [float]}``. ``GET /health`` answers ``{"ok": true, "reward": NAME, "version": VERSION}``
without a token; clients fingerprint the version, so changing it reruns what the reward trained.
Errors are JSON ``{"error": MESSAGE}``: 400 for bad requests, 401 for a missing or wrong token.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import io
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from flowpost.core.io import sha256_json
from flowpost.core.rewards.base import Reward
from flowpost.core.rewards.registry import build_reward
from flowpost.errors import FlowpostError

logger = logging.getLogger(__name__)


class BadRequest(Exception):
    """A request the server answers with HTTP 400."""


class RewardServer(ThreadingHTTPServer):
    """A threading HTTP server holding one reward; scoring calls are serialised by a lock."""

    def __init__(self, address: tuple[str, int], reward: Reward, token: str | None, version: str) -> None:
        super().__init__(address, RewardHandler)
        self.reward = reward
        self.token = token
        self.version = version
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


def decode_images(images: Any) -> Tensor:
    """[B, C, H, W] float32 in [0, 1] from base64 images of one size (C = 1 for grayscale, else 3)."""
    if not isinstance(images, list) or not images:
        raise BadRequest('"images" must be a non-empty list of base64 strings')
    arrays = []
    for i, encoded in enumerate(images):
        try:
            with Image.open(io.BytesIO(base64.b64decode(encoded, validate=True))) as image:
                image.load()
                array = np.asarray(image if image.mode == "L" else image.convert("RGB"))
        except (TypeError, binascii.Error, UnidentifiedImageError, OSError) as exc:
            raise BadRequest(f"images[{i}] is not a base64-encoded image ({exc})") from None
        arrays.append(array[..., None] if array.ndim == 2 else array)
    if any(array.shape != arrays[0].shape for array in arrays):
        shapes = sorted({array.shape for array in arrays})
        raise BadRequest(f"all images must have the same size and mode, got (H, W, C) shapes {shapes}")
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255


def _parse_request(body: bytes) -> tuple[Tensor, list[str], list[dict[str, Any]]]:
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not JSON ({exc})") from None
    if not isinstance(request, dict):
        raise BadRequest('body must be a JSON object with "prompts", "metadata" and "images"')
    media = decode_images(request.get("images"))
    batch = media.shape[0]
    prompts = request.get("prompts")
    if not isinstance(prompts, list) or len(prompts) != batch or not all(isinstance(p, str) for p in prompts):
        raise BadRequest(f'"prompts" must be a list of {batch} strings, one per image')
    metadata = request.get("metadata", [{} for _ in range(batch)])
    if not isinstance(metadata, list) or len(metadata) != batch or not all(isinstance(m, dict) for m in metadata):
        raise BadRequest(f'"metadata" must be a list of {batch} objects, one per image')
    return media, prompts, metadata


class RewardHandler(BaseHTTPRequestHandler):
    """Answers ``GET /health`` and ``POST /score`` for the server's reward."""

    server: RewardServer
    protocol_version = "HTTP/1.1"

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
        body = self.rfile.read(length)
        if self.path != "/score":
            self._answer(404, {"error": f"no such endpoint: POST {self.path}"})
            return
        if not self._authorised():
            self._answer(401, {"error": "missing or wrong bearer token"}, {"WWW-Authenticate": "Bearer"})
            return
        try:
            media, prompts, metadata = _parse_request(body)
            with self.server.score_lock:
                scores = self.server.reward(media, prompts, metadata)
        except (BadRequest, FlowpostError) as exc:
            self._answer(400, {"error": str(exc)})
            return
        except Exception:
            logger.exception("reward %s failed", self.server.reward.name)
            self._answer(500, {"error": f"reward {self.server.reward.name!r} failed; see the server log"})
            return
        if scores.shape != (media.shape[0],):
            message = f"reward returned shape {tuple(scores.shape)}, expected ({media.shape[0]},)"
            self._answer(500, {"error": message})
            return
        self._answer(200, {"scores": scores.detach().float().cpu().tolist()})

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
    reward: Reward, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None, version: str | None = None
) -> RewardServer:
    """A bound server for ``reward`` (port 0: any free port); run ``serve_forever()`` to answer requests.

    With ``token``, ``POST /score`` requires ``Authorization: Bearer <token>``. ``version`` (default:
    the reward's name) is what ``GET /health`` reports as the model version.
    """
    try:
        return RewardServer((host, port), reward, token, version or reward.name)
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
    where: str = "reward server",
) -> RewardServer:
    """A bound server for the registered reward ``name`` built with ``options``.

    ``version`` defaults to a hash of the name and options, so serving other options reads as
    another model version to the stages that fingerprint it.
    """
    version = version or sha256_json({"reward": name, "options": options})[:12]
    return serve_reward(
        build_reward(name, options=options, where=where), host=host, port=port, token=token, version=version
    )
