"""The Prefect API a flow reports to: a configured server must answer before a run starts; else a temporary one
starts, ended with this process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import httpx

from flowpost.errors import FlowpostError

HEALTH_TIMEOUT_S = 5.0
STARTUP_TIMEOUT_S = 120  # Prefect's default (20 s) is too short on a loaded host


def check_prefect_api() -> None:
    """A FlowpostError when ``PREFECT_API_URL`` names a server that does not answer its health check
    (unset, Prefect starts a temporary server of its own and there is nothing to check)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return
    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S).raise_for_status()
    except httpx.HTTPError as exc:
        raise FlowpostError(
            f"the Prefect server at {url} does not answer ({exc}); start it, or unset PREFECT_API_URL "
            "to run on a temporary server",
            where="PREFECT_API_URL",
        ) from None


@contextlib.contextmanager
def temporary_prefect_server() -> Iterator[None]:
    """With no ``PREFECT_API_URL``, start Prefect's temporary server now, under a watchdog that ends it when
    this process ends (SIGKILL included); a FlowpostError saying how to run a persistent server when it
    does not answer within ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` (120 s unless set)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, get_current_settings

    ephemeral = get_current_settings().server.ephemeral
    if PREFECT_API_URL.value() or not ephemeral.enabled:
        yield
        return
    chosen = "startup_timeout_seconds" in ephemeral.model_fields_set
    timeout = ephemeral.startup_timeout_seconds if chosen else STARTUP_TIMEOUT_S
    watchdog = subprocess.Popen([sys.executable, "-m", "flowpost.flows.watchdog", str(os.getpid())])
    try:
        server = SubprocessASGIServer()  # the instance every Prefect client of this process then uses
        try:
            server.start(timeout=timeout)
        except Exception:
            server.stop()
            raise FlowpostError(
                f"the temporary Prefect server did not start within {timeout} s (a busy host starts it slowly); "
                "start a persistent one with `prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api, "
                "or raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
                where="PREFECT_API_URL",
            ) from None
        yield
    finally:
        watchdog.terminate()
        watchdog.wait()
