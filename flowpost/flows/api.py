"""The Prefect API a flow reports to: a configured server must answer before a run starts."""

from __future__ import annotations

import httpx

from flowpost.errors import FlowpostError

HEALTH_TIMEOUT_S = 5.0


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
