"""Graceful drain: once stopping, new calls are refused while in-flight calls complete."""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.algorithms import Outcome
from sluice.app import Sluice
from sluice.backends import Hit
from sluice.backends.memory import MemoryBackend
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.settings import Settings
from tests.support.processes import free_port, sluice_serve, wait_until

RLS = "envoy.service.ratelimit.v3.RateLimitService"
OK = rls_pb2.RateLimitResponse.OK
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
POLICY = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"


class GatedBackend(MemoryBackend):
    """Holds every call until the test opens the gate: a call that is surely in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def apply(self, hits: Sequence[Hit], now: float) -> list[Outcome]:
        self.entered.set()
        await self.gate.wait()
        return await super().apply(hits, now)


def request(domain: str) -> rls_pb2.RateLimitRequest:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="k", value="v")
    return rls_pb2.RateLimitRequest(
        domain=domain, descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )


async def scenario() -> tuple[rls_pb2.RateLimitResponse, grpc.StatusCode]:
    backend = GatedBackend()
    settings = Settings(host="127.0.0.1", grpc_port=0, http_port=0, shutdown_grace_s=10)
    sluice = Sluice(settings, backend=backend)
    sluice.snapshot = Snapshot(load_text(POLICY))
    await sluice.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sluice.grpc_port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        in_flight = asyncio.ensure_future(stub.ShouldRateLimit(request("d"), timeout=20))
        await asyncio.wait_for(backend.entered.wait(), 10)
        stopping = asyncio.ensure_future(sluice.stop())
        # Probe with a domain that never reaches the backend until the server refuses it.
        refused = None
        async with asyncio.timeout(10):
            while refused is None:
                try:
                    await stub.ShouldRateLimit(request("unknown"), timeout=1)
                except grpc.aio.AioRpcError as exc:
                    refused = exc.code()
        assert not in_flight.done()
        backend.gate.set()
        response = await in_flight
        await asyncio.wait_for(stopping, 10)
    return response, refused


def test_in_flight_calls_complete_during_drain() -> None:
    response, refused = asyncio.run(scenario())
    assert response.overall_code == rls_pb2.RateLimitResponse.OK
    assert response.statuses[0].limit_remaining == 4
    # gRPC core reports a call refused during shutdown either way, depending on timing; both
    # tell a client to retry elsewhere, and neither is an answer from Sluice.
    assert refused in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


async def refusals_while_draining(calls: int) -> tuple[Counter[tuple[str, str]], int]:
    backend = GatedBackend()
    settings = Settings(host="127.0.0.1", grpc_port=0, http_port=0, shutdown_grace_s=10)
    sluice = Sluice(settings, backend=backend)
    sluice.snapshot = Snapshot(load_text(POLICY))
    await sluice.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sluice.grpc_port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        in_flight = asyncio.ensure_future(stub.ShouldRateLimit(request("d"), timeout=20))
        await asyncio.wait_for(backend.entered.wait(), 10)
        stopping = asyncio.ensure_future(sluice.stop())

        async def probe() -> tuple[str, str]:
            try:
                await stub.ShouldRateLimit(request("unknown"), timeout=5)
            except grpc.aio.AioRpcError as exc:
                return exc.code().name, exc.details()
            return "OK", ""

        first = ("OK", "")
        async with asyncio.timeout(10):
            while first == ("OK", ""):  # answered until the drain begins
                first = await probe()
        outcomes = Counter([first, *await asyncio.gather(*(probe() for _ in range(calls)))])
        backend.gate.set()
        response = await in_flight
        await asyncio.wait_for(stopping, 10)
    return outcomes, response.statuses[0].limit_remaining


def test_calls_refused_while_draining_are_unavailable_never_cancelled() -> None:
    # Many at once, on a connection the draining server keeps open: every one is refused by
    # Sluice itself with UNAVAILABLE (safe to retry elsewhere: nothing was counted), none is
    # cancelled by the transport.
    outcomes, remaining = asyncio.run(refusals_while_draining(200))
    assert outcomes == {("UNAVAILABLE", "shutting down: retry on another instance"): 201}
    assert remaining == 4


@pytest.mark.slow  # a real server per transport, and a delay of seconds
@pytest.mark.parametrize("transport", ["grpcio", "pyvoy"])
def test_sigterm_reports_not_ready_and_still_answers_for_the_drain_delay(
    tmp_path: Path, transport: str
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    management_port = free_port()
    args = [
        "--transport", transport,
        "--drain-delay-s", "4",
        "--management-port", str(management_port),
        "--management-host", "127.0.0.1",
    ]  # fmt: skip
    with sluice_serve(tmp_path, config=policy, extra_args=args) as server:
        ready = f"http://127.0.0.1:{management_port}/ready"
        assert _status(ready) == 200
        with grpc.insecure_channel(server.grpc_target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            assert stub.ShouldRateLimit(request("d"), timeout=5).overall_code == OK
            server.process.send_signal(signal.SIGTERM)
            check = health_pb2.HealthCheckRequest(service=RLS)
            wait_until(
                lambda: health.Check(check, timeout=5).status == NOT_SERVING, 3, "NOT_SERVING"
            )
            assert _status(ready) == 503
            # Still answered, not refused: the load balancer has not caught up yet.
            answer = stub.ShouldRateLimit(request("d"), timeout=5)
            assert answer.overall_code == OK
            assert answer.statuses[0].limit_remaining == 3
            assert server.process.poll() is None
        assert server.process.wait(30) == 0


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


# Loaded at startup by each Python process of the test's `sluice serve` (the launcher and, under
# pyvoy, the interpreter inside Envoy): the drain does its work, then raises, as a bug would.
BREAK_THE_DRAIN = """
import os

if os.environ.get("SLUICE_TEST_BREAK_THE_DRAIN"):
    from sluice.app import Sluice

    _stop = Sluice.stop

    async def stop(self, *, exiting=False):
        await _stop(self, exiting=exiting)
        raise RuntimeError("the drain broke (on purpose)")

    Sluice.stop = stop
"""


@pytest.mark.slow  # a real server per transport
@pytest.mark.parametrize("transport", ["grpcio", "pyvoy"])
def test_a_drain_that_raises_ends_the_server_at_once_with_exit_code_1(
    tmp_path: Path, transport: str
) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(BREAK_THE_DRAIN)
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])),
        "SLUICE_TEST_BREAK_THE_DRAIN": "1",
    }
    with sluice_serve(
        tmp_path,
        extra_args=["--transport", transport],
        env=env,
        allowed_tracebacks=[r"^RuntimeError: the drain broke \(on purpose\)$"],
        exit_code=1,
    ) as server:
        server.process.send_signal(signal.SIGTERM)
        # A clean stop takes a fraction of a second; before the fix, pyvoy's launcher waited
        # its 30 s for a confirmation that never came.
        assert server.process.wait(timeout=10) == 1
    log = server.log()
    assert "stopping failed\nTraceback (most recent call last):" in log, log
    assert log.count("RuntimeError: the drain broke (on purpose)") == 1, log
