"""aiohttp application for the management port: plaintext always, for kubelet probes and
Prometheus, which cannot present the client certificate the service ports may demand.

- ``/healthcheck``: liveness, 200 ``OK`` while the process serves its event loop (also while
  draining: restarting a draining process would cut its calls in flight);
- ``/ready``: readiness (sluice/readiness.py), 200 ``READY`` or 503 with the reason;
- ``/metrics``: Prometheus metrics, as on the HTTP port.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from sluice.metrics import CONTENT_TYPE, Metrics

__all__ = ["make_management_app"]


def make_management_app(
    *, not_ready_reason: Callable[[], Awaitable[str | None]], metrics: Metrics
) -> web.Application:
    async def healthcheck(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def ready(request: web.Request) -> web.Response:
        reason = await not_ready_reason()
        if reason is None:
            return web.Response(text="READY")
        return web.Response(status=503, text=f"NOT READY: {reason}")

    async def metrics_endpoint(request: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application(client_max_size=1024)  # nothing here takes a body
    app.router.add_get("/healthcheck", healthcheck)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics_endpoint)
    return app
