"""aiohttp application for the HTTP port.

``/json`` takes a RateLimitRequest in protobuf's JSON mapping and answers with the
RateLimitResponse as JSON: 200 when OK, 429 when over limit, 400 on bad input.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from aiohttp import web

from sluice.errors import BackendUnavailableError, InvalidRequestError
from sluice.grpc.convert import decision_to_json, request_from_json
from sluice.limiter import RateLimiter
from sluice.model import Code

__all__ = ["make_app"]


def make_app(
    limiter: RateLimiter, *, healthy: Callable[[], bool], max_body_bytes: int
) -> web.Application:
    async def healthcheck(request: web.Request) -> web.Response:
        if healthy():
            return web.Response(text="OK")
        return web.Response(status=500, text="NOT SERVING")

    async def json_endpoint(request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body: larger than the maximum of {max_body_bytes} bytes")
        try:
            decision = await limiter.should_rate_limit(request_from_json(body))
        except InvalidRequestError as exc:
            return _error(400, str(exc))
        except BackendUnavailableError as exc:
            return _error(503, str(exc))
        text = decision_to_json(decision)
        status = 429 if decision.overall_code is Code.OVER_LIMIT else 200
        return web.Response(status=status, text=text, content_type="application/json")

    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_get("/healthcheck", healthcheck)
    app.router.add_post("/json", json_endpoint)
    return app


def _error(status: int, message: str) -> web.Response:
    return web.Response(
        status=status, text=json.dumps({"error": message}), content_type="application/json"
    )
