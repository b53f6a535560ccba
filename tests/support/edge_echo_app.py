"""A gRPC service on Sluice's ASGI edge (sluice.edge), for its tests: run it with
``pyvoy tests.support.edge_echo_app:app``. Messages are raw bytes (no protobuf)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from sluice.edge import Context, GrpcApp, GrpcError, Status
from sluice.edge.asgi import STREAM_STREAM, STREAM_UNARY, UNARY_STREAM, UNARY_UNARY
from sluice.edge.health import HealthService

counts = {"slow_started": 0, "slow_finished": 0, "slow_cancelled": 0}


def same(data: bytes) -> bytes:
    return data


async def unary(request: bytes, context: Context) -> bytes:
    """The request back; request metadata x-* back as trailers, and one initial header."""
    context.set_initial_metadata([("x-initial", "yes")])
    context.set_trailing_metadata(
        [(key, value) for key, value in context.metadata if key.startswith("x-")]
    )
    return request


async def slow(request: bytes, context: Context) -> bytes:
    """Sleeps the seconds the request names; counts what became of each call."""
    counts["slow_started"] += 1
    try:
        await asyncio.sleep(float(request.decode()))
    except asyncio.CancelledError:
        counts["slow_cancelled"] += 1
        raise
    counts["slow_finished"] += 1
    return request


async def stats(request: bytes, context: Context) -> bytes:
    return json.dumps(counts).encode()


async def fail(request: bytes, context: Context) -> bytes:
    if request == b"status":
        raise GrpcError(Status.FAILED_PRECONDITION, "100% wrong: ünïcode", [("x-why", "test")])
    raise RuntimeError("a bug")


async def count_to(request: bytes, context: Context) -> AsyncIterator[bytes]:
    for i in range(int(request.decode())):
        yield str(i).encode()


async def total(requests: AsyncIterator[bytes], context: Context) -> bytes:
    return str(sum([int(r.decode()) async for r in requests])).encode()


async def echo(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request.upper()


app = GrpcApp(max_receive_message_bytes=1024 * 1024)
for path, kind, handler in [
    ("/test.Echo/Unary", UNARY_UNARY, unary),
    ("/test.Echo/Slow", UNARY_UNARY, slow),
    ("/test.Echo/Stats", UNARY_UNARY, stats),
    ("/test.Echo/Fail", UNARY_UNARY, fail),
    ("/test.Echo/CountTo", UNARY_STREAM, count_to),
    ("/test.Echo/Total", STREAM_UNARY, total),
    ("/test.Echo/Echo", STREAM_STREAM, echo),
]:
    app.add_method(path, kind, handler, same, same)
health = HealthService(["test.Echo"])
health.add_to(app)
app.on_startup.append(lambda: health.set_all(1))
