"""``remote``: a reward scored by an HTTP server (see ``server.py`` for the protocol)."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx
import torch
from PIL import Image
from torch import Tensor

from flowpost.core.rewards.http_session import HttpSession
from flowpost.errors import FlowpostError, TransientError

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG"}
JPEG_QUALITY = 95


def encode_images(media: Tensor, image_format: str = "png") -> list[str]:
    """Base64 strings of ``media`` [B, 1 or 3, H, W] in [0, 1], quantised to uint8 and encoded as ``image_format``."""
    if media.ndim != 4 or media.shape[1] not in (1, 3):
        raise FlowpostError(
            f"remote rewards need grayscale or RGB media [B, 1 or 3, H, W], got {tuple(media.shape)}", where="rewards"
        )
    pixels = (media.detach().float() * 255).round().clamp(0, 255).to(torch.uint8)
    encoded = []
    for image in pixels.permute(0, 2, 3, 1).cpu().numpy():
        buffer = io.BytesIO()
        options = {"quality": JPEG_QUALITY} if image_format == "jpeg" else {}
        Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(
            buffer, format=IMAGE_FORMATS[image_format], **options
        )
        encoded.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    return encoded


def without_secrets(url: str) -> str:
    """``url`` without credentials, query or fragment: safe to print."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def checked_url(url: str, *, where: str) -> str:
    """``url`` without secrets (``without_secrets``) once it is an http(s) address with a host and no
    credentials; otherwise an error naming ``where``."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise FlowpostError(
            f"remote reward url must be http(s)://HOST[:PORT]/PATH, got scheme {parts and parts.scheme!r} "
            f"and host {parts and parts.hostname!r}",
            where=where,
        )
    if parts.username is not None or parts.password is not None:
        raise FlowpostError(
            "remote reward url must not contain credentials; put a token in an environment variable "
            "and name it with token_env",
            where=where,
        )
    return without_secrets(url)


def _json_value(value: Any) -> Any:
    """Numpy/torch scalars and arrays in metadata become plain lists and numbers."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _error_detail(body: bytes) -> str:
    """The ``error`` of a JSON error answer, else the body as text; at most 200 characters."""
    text = body.decode("utf-8", "replace")
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        return text[:200]
    return str(answer["error"])[:200] if isinstance(answer, dict) and "error" in answer else text[:200]


def send_with_retries(
    client: httpx.Client,
    url: str,
    body: bytes | None,
    *,
    headers: dict[str, str],
    retries: int,
    backoff: float,
    where: str,
    redact: Callable[[str], str] = str,
) -> bytes:
    """POST ``body`` to ``url`` (GET when None); the raw answer of the first success.

    Connection errors, timeouts and HTTP 5xx are retried ``retries`` times, sleeping ``backoff * 2**attempt``
    seconds before each retry (then a ``TransientError``); 4xx answers and redirects are errors at once.
    ``redact`` masks secrets in the server's text before it reaches an error.
    """
    last_error = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            if body is None:
                response = client.get(url, headers=headers)
            else:
                response = client.post(url, content=body, headers=headers)
        except httpx.TransportError as exc:
            last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            continue
        if response.is_redirect:
            target = without_secrets(urljoin(url, response.headers.get("Location", "")))
            raise FlowpostError(
                f"reward server redirected (HTTP {response.status_code}) to {target}; redirects are not "
                "followed for scoring: set the reward's url to the address that answers",
                where=where,
            )
        if response.is_success:
            return response.content
        detail = redact(_error_detail(response.content))
        status = f"HTTP {response.status_code} {response.reason_phrase}: {detail}"
        if response.status_code < 500:
            raise FlowpostError(f"reward server answered {status}", where=where)
        last_error = status
    raise TransientError(
        f"reward server failed {retries + 1} attempts (1 + {retries} retries); last error: {last_error}", where=where
    )


class RemoteReward:
    """POSTs ``{"prompts", "metadata", "images"}`` (base64 PNG per sample) to ``url``; reads ``{"scores"}``.

    Connection errors, timeouts and HTTP 5xx are retried ``retries`` times, sleeping
    ``backoff * 2**attempt`` seconds before each retry; 4xx answers are not retried. With
    ``token_env``, the environment variable of that name holds a bearer token, sent as
    ``Authorization: Bearer ...``; the token never appears in configs, logs or errors. Redirects are
    not followed (they would carry the token, and the scores, to another address). Pipelines
    fingerprint the model version the server's ``GET /health`` reports, unless ``version`` pins it.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "remote",
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        token_env: str | None = None,
        image_format: str = "png",
        version: str | None = None,
    ) -> None:
        self.where = checked_url(url, where="rewards")
        if image_format not in IMAGE_FORMATS:
            raise FlowpostError(
                f"image_format must be one of {', '.join(IMAGE_FORMATS)}, got {image_format!r}", where=self.where
            )
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise FlowpostError("remote reward needs timeout > 0, retries >= 0 and backoff >= 0", where=self.where)
        self.url = url
        self.name = name
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.token_env = token_env
        self.image_format = image_format
        self.version = version
        self.http = HttpSession(timeout=self.timeout, token_env=token_env)
        self._token()  # fail at construction, not at the first batch

    def _token(self) -> str | None:
        if self.token_env is None:
            return None
        token = os.environ.get(self.token_env)
        if not token:
            raise FlowpostError(
                f"environment variable {self.token_env} (token_env of reward {self.name!r}) is not set",
                where=self.where,
            )
        return token

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        batch = media.shape[0]
        if batch == 0:
            return torch.zeros(0, dtype=torch.float32, device=media.device)
        try:
            body = json.dumps(
                {
                    "prompts": list(prompts),
                    "metadata": list(metadata),
                    "images": encode_images(media, self.image_format),
                },
                default=_json_value,
            ).encode()
        except (TypeError, ValueError) as exc:
            raise FlowpostError(f"prompts and metadata must be JSON serialisable ({exc})", where=self.where) from None
        scores = self._parse(self._send(self.url, body), batch)
        return torch.tensor(scores, dtype=torch.float32, device=media.device)

    def served_version(self) -> str:
        """The pinned ``version``, else the model version the server's ``GET /health`` reports."""
        if self.version is not None:
            return self.version
        parts = urlsplit(self.url)
        health = urlunsplit((parts.scheme, parts.netloc, parts.path.rsplit("/", 1)[0] + "/health", "", ""))
        answer = self._json(self._send(health, None))
        version = answer.get("version") if isinstance(answer, dict) else None
        return str(version) if version is not None else "unversioned"

    def _send(self, url: str, body: bytes | None) -> bytes:
        """POST ``body`` (GET when None) with this reward's token, retries and backoff; the raw answer."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        token = self._token()
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return send_with_retries(
            self.http.client(),
            url,
            body,
            headers=headers,
            retries=self.retries,
            backoff=self.backoff,
            where=self.where,
            redact=self.http.redact,
        )

    def _json(self, raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            excerpt = self.http.redact(raw[:200].decode("utf-8", "replace"))
            raise FlowpostError(f"reward server answered non-JSON: {excerpt!r}", where=self.where) from None

    def _parse(self, raw: bytes, batch: int) -> list[float]:
        answer = self._json(raw)
        if not isinstance(answer, dict) or "scores" not in answer:
            excerpt = self.http.redact(json.dumps(answer)[:200])
            raise FlowpostError(f'reward server answer has no "scores": {excerpt}', where=self.where)
        scores = answer["scores"]
        if not isinstance(scores, list) or len(scores) != batch:
            got = f"{len(scores)} scores" if isinstance(scores, list) else type(scores).__name__
            raise FlowpostError(
                f'reward server "scores" must be a list of {batch} numbers, got {got}', where=self.where
            )
        for i, score in enumerate(scores):
            if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
                raise FlowpostError(
                    f"reward server score {i} is {self.http.redact(repr(score))[:200]}; every score must be a finite "
                    "number",
                    where=self.where,
                )
        return [float(score) for score in scores]
