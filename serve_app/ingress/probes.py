"""``/ready`` and ``/health`` answers shared by both HTTP paths (router and direct).

Both paths answer the same probes the same way, so a load balancer or a
test does not need to know which path a deployment runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from fastapi.responses import JSONResponse

READY_TIMEOUT_S = 10.0


async def failure(check: Awaitable, timeout_s: float = READY_TIMEOUT_S) -> str | None:
    """Run a health check; None if it passed within ``timeout_s``, else what went wrong (for the body)."""
    try:
        await asyncio.wait_for(check, timeout_s)
    except Exception as e:  # any failure means "not ready"; the body says which and why
        return f"{type(e).__name__}: {e}"[:500]
    return None


def ready(models: list[str]) -> JSONResponse:
    return JSONResponse({"status": "ready", "models": models})


def not_ready(failed: dict[str, str]) -> JSONResponse:
    """503 in OpenAI's error shape, naming each model without a healthy replica and why."""
    return JSONResponse(
        status_code=503,
        content={
            "error": {
                "message": f"not ready: {', '.join(failed)} has no healthy replica",
                "type": "service_unavailable",
                "param": None,
                "code": 503,
                "models": failed,
            }
        },
    )


def alive() -> JSONResponse:
    return JSONResponse({"status": "ok"})
