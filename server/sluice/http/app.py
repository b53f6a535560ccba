"""aiohttp application for the HTTP port.

- ``/healthcheck``: 200 ``OK`` while serving, 500 while draining;
- ``/json``: a RateLimitRequest in protobuf's JSON mapping, answered with the
  RateLimitResponse as JSON: 200 when OK, 429 when over limit, 400 on bad input;
- ``/rlconfig``: the live config version and every compiled rule, as text;
- ``/status``: JSON detail: serving, config version and source, config database state;
- ``/metrics``: Prometheus metrics;
- ``/api/v1/…``: the policy write API (http/api.py), when a service is given; the runtime
  state (leases held, RLQS buckets: http/runtime.py), when ``runtime`` is given.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from sluice.errors import SluiceError, status_of
from sluice.grpc.convert import decision_to_json, request_from_json
from sluice.http.api import add_api_routes
from sluice.http.runtime import Runtime, add_runtime_routes
from sluice.limiter import RateLimiter
from sluice.metrics import CONTENT_TYPE, Metrics
from sluice.model import Code
from sluice.policies.service import PolicyService
from sluice.policies.snapshot import Snapshot

__all__ = ["make_app"]


def make_app(
    limiter: RateLimiter,
    *,
    healthy: Callable[[], bool],
    snapshot: Callable[[], Snapshot],
    status: Callable[[], dict[str, Any]],
    max_body_bytes: int,
    body_timeout_s: float = 15.0,
    service: PolicyService | None = None,
    api_token: str = "",
    metrics: Metrics | None = None,
    runtime: Runtime | None = None,
) -> web.Application:
    async def healthcheck(request: web.Request) -> web.Response:
        if healthy():
            return web.Response(text="OK")
        return web.Response(status=500, text="NOT SERVING")

    too_large = f"body: larger than the maximum of {max_body_bytes} bytes"

    async def json_endpoint(request: web.Request) -> web.Response:
        # A declared length over the maximum is refused before any of the body arrives: a
        # client must not hold a connection open with a promise it will not keep.
        if request.content_length is not None and request.content_length > max_body_bytes:
            return _error(413, too_large)
        try:
            # A body trickled in holds a connection and a handler: it gets as long as the
            # headers did (--http-idle-timeout-s).
            async with asyncio.timeout(body_timeout_s):
                body = await request.read()
        except TimeoutError:
            # Closed after the answer: the rest of the body is not waited for.
            response = _error(408, f"body: not received within {body_timeout_s:g} s")
            response.force_close()
            return response
        except web.HTTPRequestEntityTooLarge:
            return _error(413, too_large)  # chunked, or compressed, past the maximum
        except ConnectionResetError:
            # The client left halfway through its body; nobody reads this answer, but
            # returning one keeps a routine disconnect out of the error log.
            return _error(400, "body: the connection closed before the whole body arrived")
        try:
            decision = await limiter.should_rate_limit(request_from_json(body))
        except SluiceError as exc:
            status = status_of(exc)
            if status is None:
                raise  # a bug: aiohttp answers 500 and logs it
            return _error(status.http, str(exc))
        text = decision_to_json(decision)
        code = 429 if decision.overall_code is Code.OVER_LIMIT else 200
        return web.Response(status=code, text=text, content_type="application/json")

    async def rlconfig(request: web.Request) -> web.Response:
        return web.Response(text=snapshot().dump())

    async def status_endpoint(request: web.Request) -> web.Response:
        body = {"serving": healthy(), **status()}
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def metrics_endpoint(request: web.Request) -> web.Response:
        assert metrics is not None
        return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    _quiet_client_errors()
    app = web.Application(client_max_size=max_body_bytes)
    if metrics is not None:
        app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/healthcheck", healthcheck)
    app.router.add_post("/json", json_endpoint)
    app.router.add_get("/rlconfig", rlconfig)
    app.router.add_get("/status", status_endpoint)
    if service is not None:
        add_api_routes(app, service, api_token)
    if runtime is not None:
        add_runtime_routes(app, runtime, snapshot, api_token)
    return app


class _ClientErrorsAtDebug(logging.Filter):
    """aiohttp logs a request that is not valid HTTP as an ERROR with its traceback. It is the
    client's error, answered with 400, and anyone who can reach the port can send any number
    of them: one line at DEBUG, not a traceback, so logs stay readable under such traffic."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], HttpProcessingError):
            record.msg = f"{record.msg}: {record.exc_info[1]}"
            record.exc_info = None
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def _quiet_client_errors() -> None:
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _ClientErrorsAtDebug) for f in logger.filters):
        logger.addFilter(_ClientErrorsAtDebug())


def _error(status: int, message: str) -> web.Response:
    return web.Response(
        status=status, text=json.dumps({"error": message}), content_type="application/json"
    )
