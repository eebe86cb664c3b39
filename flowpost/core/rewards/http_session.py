"""The HTTP side a scorer talking to a server holds: one pooled client and the masking of its bearer token."""

from __future__ import annotations

import os
from typing import Any

import httpx


class HttpSession:
    """One ``httpx`` client, created on first use, that never follows redirects and is left behind when its owner
    is pickled (connections do not travel); ``redact`` masks the bearer token the environment variable
    ``token_env`` holds in text from the server, which may echo the request's headers."""

    def __init__(self, *, timeout: float, token_env: str | None) -> None:
        self.timeout, self.token_env = timeout, token_env
        self._client: httpx.Client | None = None

    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout, follow_redirects=False)
        return self._client

    def redact(self, text: str) -> str:
        token = os.environ.get(self.token_env) if self.token_env else None
        return text.replace(token, "[token]") if token else text

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}
