"""RateLimitInterceptor on a real grpc.aio server, called by a real gRPC client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from sluice_client import AsyncClient
from sluice_client.grpc_interceptor import (
    RateLimitInterceptor,
    full_method,
    metadata,
    nested,
)
from tests.support.processes import SluiceProcess

SERVICE = "test.Echo"


async def say(request: bytes, context: Any) -> bytes:
    return b"echo:" + request


async def count(request: bytes, context: Any) -> AsyncIterator[bytes]:
    for i in range(3):
        yield str(i).encode()


def descriptors(details: grpc.HandlerCallDetails) -> list[dict[str, str]]:
    if details.method.endswith("/Free"):
        return []
    return nested(full_method(), metadata("x-tenant", key="tenant"))(details)


async def start(client: AsyncClient) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(
        interceptors=[
            RateLimitInterceptor(client=client, domain="clients", descriptors=descriptors)
        ]
    )
    handlers = {
        "Say": grpc.unary_unary_rpc_method_handler(say),
        "Free": grpc.unary_unary_rpc_method_handler(say),
        "Count": grpc.unary_stream_rpc_method_handler(count),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_refused_calls_end_with_resource_exhausted_and_retry_after(
    sluice: SluiceProcess, unique: str
) -> None:
    async def run() -> None:
        async with AsyncClient(sluice.grpc_target) as client:
            server, target = await start(client)
            try:
                async with grpc.aio.insecure_channel(target) as channel:
                    say_rpc = channel.unary_unary(f"/{SERVICE}/Say")
                    tenant = (("x-tenant", unique),)
                    assert await say_rpc(b"1", metadata=tenant) == b"echo:1"
                    assert await say_rpc(b"2", metadata=tenant) == b"echo:2"
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await say_rpc(b"3", metadata=tenant)
                    error = caught.value
                    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                    trailers = dict(error.trailing_metadata())
                    assert 0 < int(trailers["retry-after"]) <= 3600
                    assert trailers["ratelimit-policy"] == '"per-tenant-method";q=2;w=3600'

                    # Another method is another counter; a streaming one is refused alike.
                    count_rpc = channel.unary_stream(f"/{SERVICE}/Count")
                    assert [m async for m in count_rpc(b"", metadata=tenant)] == [b"0", b"1", b"2"]
                    assert len([m async for m in count_rpc(b"", metadata=tenant)]) == 3
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        [m async for m in count_rpc(b"", metadata=tenant)]
                    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED

                    # No descriptors (no tenant, or an unlimited method): never checked.
                    for _ in range(3):
                        assert await say_rpc(b"anon") == b"echo:anon"
                        assert (
                            await channel.unary_unary(f"/{SERVICE}/Free")(b"f", metadata=tenant)
                            == b"echo:f"
                        )
            finally:
                await server.stop(None)

    asyncio.run(run())


def test_sluice_down_under_deny_answers_unavailable(unreachable_target: str) -> None:
    async def run() -> grpc.StatusCode:
        async with AsyncClient(unreachable_target, on_unavailable="deny") as client:
            server, target = await start(client)
            try:
                async with grpc.aio.insecure_channel(target) as channel:
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await channel.unary_unary(f"/{SERVICE}/Say")(
                            b"x", metadata=(("x-tenant", "t"),)
                        )
                    return caught.value.code()
            finally:
                await server.stop(None)

    assert asyncio.run(run()) is grpc.StatusCode.UNAVAILABLE
