"""The ASGI app behind ``RewardServer``: routes, bearer token, body limit and JSON error answers."""

from __future__ import annotations

import hmac
import logging
import threading
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowpost.core.rewards.base import Reward
from flowpost.core.rewards.score_request import BadRequest, ScoreBody, parse_score_request
from flowpost.errors import FlowpostError

logger = logging.getLogger(__name__)

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """The largest ``POST /score`` body (bytes) and batch (images), and the requests held open at once."""

    max_body_bytes: int = 256 * MIB
    max_batch: int = 1024
    max_open_requests: int = 64


def score_app(reward: Reward, *, token: str | None, version: str, limits: Limits) -> ASGIApp:
    """``GET /health`` and ``POST /score`` for ``reward``; scoring calls are serialised by a lock."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    score_lock = threading.Lock()

    def authorised(authorization: Annotated[str | None, Header()] = None) -> None:
        if token is not None and not hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode()):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "reward": reward.name, "version": version}

    def scored(body: ScoreBody) -> JSONResponse:
        try:
            request = parse_score_request(body, max_batch=limits.max_batch)
            with score_lock:
                scores = reward(request.media, request.prompts, request.metadata)
        except BadRequest as exc:
            return _error(exc.status, str(exc))
        except FlowpostError as exc:
            return _error(400, str(exc))
        except Exception:
            logger.exception("reward %s failed", reward.name)
            return _error(500, f"reward {reward.name!r} failed; see the server log")
        batch = request.media.shape[0]
        if tuple(scores.shape) != (batch,):
            return _error(500, f"reward returned shape {tuple(scores.shape)}, expected ({batch},)")
        return JSONResponse({"scores": scores.detach().float().cpu().tolist()})

    @app.post("/score", dependencies=[Depends(authorised)])
    async def score(request: Request) -> JSONResponse:
        try:  # the body is JSON whatever its Content-Type says
            body = ScoreBody.model_validate_json(await request.body())
        except ValidationError as exc:
            return _error(400, _describe(exc.errors()))
        return await run_in_threadpool(scored, body)

    @app.exception_handler(HTTPException)
    async def refused(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            return _error(exc.status_code, f"no such endpoint: {request.method} {request.url.path}")
        return _error(exc.status_code, str(exc.detail), exc.headers)

    return BodyLimit(app, limits.max_body_bytes)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _describe(errors: Any) -> str:
    """One line for pydantic's errors: ``body is not JSON (...)`` or ``FIELD: message; ...``."""
    errors = list(errors)
    if any(error["type"] == "json_invalid" for error in errors):
        return f"body is not JSON ({errors[0]['msg']})"
    return "; ".join(f"{_field(error['loc'])}: {error['msg']}" for error in errors)


def _field(location: tuple[Any, ...]) -> str:
    """``prompts.0`` for pydantic's ``("prompts", 0)``; ``body`` for the body itself."""
    return ".".join(str(part) for part in location) or "body"


class BodyLimit:
    """ASGI middleware answering 413 to a body over ``max_bytes`` (by its Content-Length, or as it
    streams in); the app then reads the body from memory."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and int(declared) > self.max_bytes:
            await self._refuse(send, f"request body of {int(declared)} bytes")
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._refuse(send, f"request body of more than {self.max_bytes} bytes")
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, what: str) -> None:
        message = (
            f"{what} is over this server's limit of {self.max_bytes} bytes; send smaller batches or start "
            "the server with a larger --max-body-mb"
        )
        await _error(413, message)({"type": "http"}, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.disconnect"}
