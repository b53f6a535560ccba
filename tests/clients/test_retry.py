"""sluice-client retries UNAVAILABLE once, on the next server: a Sluice shutting down refuses
new calls with UNAVAILABLE before counting anything, and the call goes to another (round
robin over the target's addresses, so on another connection).

Two real Sluices in this process (grpc.aio, one event loop in a thread), one of them
draining; the client's target names both, as a Kubernetes headless Service resolves."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import grpc
import pytest

from sluice.app import Sluice
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.settings import Settings
from sluice_client import AsyncClient, Client
from sluice_client._wire import retry_timeout_s

POLICY = (
    "domain: r\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
)
CALLS = 12


@pytest.fixture(scope="module")
def draining_and_serving() -> Iterator[str]:
    """``ipv4:`` target of two Sluices: the first draining (refusing with UNAVAILABLE)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="retry-sluices", daemon=True)
    thread.start()
    settings = Settings(host="127.0.0.1", grpc_port=0, http_port=0)

    async def start() -> tuple[Sluice, Sluice]:
        servers = (Sluice(settings), Sluice(settings))
        for server in servers:
            server.install(Snapshot(load_text(POLICY)))
            await server.start()
        assert await servers[0].rls.drain(1)  # nothing in flight: refusing from now on
        return servers

    draining, serving = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    try:
        yield f"ipv4:127.0.0.1:{draining.grpc_port},127.0.0.1:{serving.grpc_port}"
    finally:
        for server in (draining, serving):
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_a_refusal_from_a_draining_server_is_retried_on_the_other(
    draining_and_serving: str,
) -> None:
    with Client(draining_and_serving, on_unavailable="allow", timeout_s=5) as client:
        # Connected: a fresh channel's first call may find only one server's connection up.
        for _ in range(50):
            if not client.check("r", [{"user": "warm-up"}]).degraded:
                break
        # Each user's limit is 1: a call counted twice (once per server) would be refused.
        decisions = [client.check("r", [{"user": uuid.uuid4().hex}]) for _ in range(CALLS)]
    assert [(d.allowed, d.degraded) for d in decisions] == [(True, False)] * CALLS


def test_the_async_client_retries_too(draining_and_serving: str) -> None:
    async def calls() -> list[tuple[bool, bool]]:
        async with AsyncClient(draining_and_serving, on_unavailable="allow", timeout_s=5) as c:
            for _ in range(50):  # connected, as above
                if not (await c.check("r", [{"user": "warm-up"}])).degraded:
                    break
            decisions = [await c.check("r", [{"user": uuid.uuid4().hex}]) for _ in range(CALLS)]
        return [(d.allowed, d.degraded) for d in decisions]

    assert asyncio.run(calls()) == [(True, False)] * CALLS


def test_only_unavailable_is_retried_and_only_within_the_timeout() -> None:
    class Failed(grpc.RpcError):
        def __init__(self, code: grpc.StatusCode) -> None:
            self._code = code

        def code(self) -> grpc.StatusCode:
            return self._code

    assert retry_timeout_s(Failed(grpc.StatusCode.UNAVAILABLE), left_s=0.2) == 0.2
    assert retry_timeout_s(Failed(grpc.StatusCode.UNAVAILABLE), left_s=0.0) is None
    # These may follow a call Sluice counted: asking again could count it twice.
    for code in (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.INVALID_ARGUMENT,
    ):
        assert retry_timeout_s(Failed(code), left_s=0.2) is None
