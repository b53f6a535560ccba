"""Two ``sluice serve`` processes on one Redis (standalone and a 3-master Cluster), one on each
gRPC transport (pyvoy, grpc.aio), grant exactly the concurrency limit under 200 concurrent
Acquire calls split between them; ShouldRateLimit on either sees the leases the other granted."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import grpc
import pytest

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice._proto.sluice.lease.v1 import lease_pb2, lease_pb2_grpc
from tests.support.processes import SluiceProcess, sluice_serve

LIMIT = 50
POLICY = f"""\
domain: exact
descriptors:
  - key: job
    rate_limit: {{concurrency: {LIMIT}, lease_ttl: 5m}}
"""


@pytest.fixture(scope="module", params=["standalone", "cluster"])
def servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[SluiceProcess]]:
    url = request.getfixturevalue(
        "redis_server" if request.param == "standalone" else "redis_cluster"
    )
    workdir = tmp_path_factory.mktemp("lease-exact")
    config = workdir / "policy.yaml"
    config.write_text(POLICY)
    args = ["--backend", "redis", "--redis-url", url, "--redis-key-prefix", f"x{uuid.uuid4().hex}:"]
    # Exactness is the subject, not timeouts (see test_redis_exactness.py).
    args += ["--redis-timeout-ms", "1000"]
    second_dir = workdir / "second"
    second_dir.mkdir()
    with ExitStack() as stack:
        first = stack.enter_context(sluice_serve(workdir, config=config, extra_args=args))
        second = stack.enter_context(
            sluice_serve(
                second_dir,
                database_url=f"sqlite:///{workdir / 'sluice.db'}",
                extra_args=[*args, "--transport", "grpcio"],
            )
        )
        yield [first, second]


def _entries(value: str) -> list[lease_pb2.Entry]:
    return [lease_pb2.Entry(key="job", value=value)]


async def _acquire_all(servers: list[SluiceProcess], value: str, n: int) -> list[tuple[int, str]]:
    """(which server, lease id or "") for ``n`` concurrent Acquire calls, alternating."""
    channels = [grpc.aio.insecure_channel(s.grpc_target) for s in servers]
    stubs = [lease_pb2_grpc.LeaseServiceStub(c) for c in channels]
    request = lease_pb2.AcquireRequest(domain="exact", entries=_entries(value))
    try:
        responses = await asyncio.gather(
            *(stubs[i % len(stubs)].Acquire(request, timeout=10) for i in range(n))
        )
    finally:
        for channel in channels:
            await channel.close()
    return [(i % len(stubs), r.lease_id if r.granted else "") for i, r in enumerate(responses)]


async def _release(server: SluiceProcess, value: str, lease_id: str) -> bool:
    async with grpc.aio.insecure_channel(server.grpc_target) as channel:
        stub = lease_pb2_grpc.LeaseServiceStub(channel)
        request = lease_pb2.ReleaseRequest(
            domain="exact", entries=_entries(value), lease_id=lease_id
        )
        return (await stub.Release(request, timeout=10)).released


async def _status(server: SluiceProcess, value: str) -> rls_pb2.RateLimitResponse.DescriptorStatus:
    async with grpc.aio.insecure_channel(server.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="job", value=value)
        request = rls_pb2.RateLimitRequest(
            domain="exact", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
        )
        return (await stub.ShouldRateLimit(request, timeout=10)).statuses[0]


def test_exactly_the_limit_is_granted_across_instances(servers: list[SluiceProcess]) -> None:
    value = uuid.uuid4().hex
    results = asyncio.run(_acquire_all(servers, value, 200))
    granted = [(server, lease_id) for server, lease_id in results if lease_id]
    assert len(granted) == LIMIT
    assert len({lease_id for _, lease_id in granted}) == LIMIT
    for server in servers:
        status = asyncio.run(_status(server, value))
        assert status.code == rls_pb2.RateLimitResponse.OVER_LIMIT
        assert (status.limit_remaining, status.current_limit.requests_per_unit) == (0, LIMIT)
    # Each lease is released once, through either instance (not the one that granted it).
    released = [
        asyncio.run(_release(servers[1 - server], value, lease_id)) for server, lease_id in granted
    ]
    assert released == [True] * LIMIT
    assert not asyncio.run(_release(servers[0], value, granted[0][1]))  # released already
    for server in servers:
        status = asyncio.run(_status(server, value))
        assert (status.code, status.limit_remaining) == (rls_pb2.RateLimitResponse.OK, LIMIT)


def test_the_slots_freed_are_taken_again_exactly(servers: list[SluiceProcess]) -> None:
    value = uuid.uuid4().hex
    first = [lease_id for _, lease_id in asyncio.run(_acquire_all(servers, value, 200)) if lease_id]
    for lease_id in first[:10]:
        assert asyncio.run(_release(servers[0], value, lease_id))
    again = asyncio.run(_acquire_all(servers, value, 200))
    assert sum(1 for _, lease_id in again if lease_id) == 10


def test_bad_requests_are_refused_by_field_on_both_transports(
    servers: list[SluiceProcess],
) -> None:
    async def refusal(server: SluiceProcess, call: str, request: object) -> tuple[object, str]:
        async with grpc.aio.insecure_channel(server.grpc_target) as channel:
            stub = lease_pb2_grpc.LeaseServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await getattr(stub, call)(request, timeout=10)
            return raised.value.code(), raised.value.details() or ""

    cases = [
        (
            "Acquire",
            lease_pb2.AcquireRequest(domain="exact"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "entries: must not be empty",
        ),
        (
            "Acquire",
            lease_pb2.AcquireRequest(domain="exact", entries=_entries("x"), ttl_ms=300_001),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ttl: must be more than 0 and at most the rule's lease_ttl of 300s, not 300001ms",
        ),
        (
            "Renew",
            lease_pb2.RenewRequest(domain="exact", entries=_entries("x")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "lease_id: must not be empty",
        ),
        (
            "Release",
            lease_pb2.ReleaseRequest(domain="other", entries=_entries("x"), lease_id="a"),
            grpc.StatusCode.NOT_FOUND,
            "domain: no policy for domain 'other'",
        ),
        (
            "Release",
            lease_pb2.ReleaseRequest(
                domain="exact", entries=[lease_pb2.Entry(key="user", value="x")], lease_id="a"
            ),
            grpc.StatusCode.NOT_FOUND,
            "entries: no concurrency rule of domain 'exact' matches user=x",
        ),
    ]
    for server in servers:
        for call, request, code, message in cases:
            assert asyncio.run(refusal(server, call, request)) == (code, message)


def test_undecodable_bytes_are_refused_by_name(servers: list[SluiceProcess]) -> None:
    async def call(server: SluiceProcess) -> tuple[object, str]:
        async with grpc.aio.insecure_channel(server.grpc_target) as channel:
            method = channel.unary_unary("/sluice.lease.v1.LeaseService/Acquire")
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await method(b"\xff\xff\xff", timeout=10)
            return raised.value.code(), raised.value.details() or ""

    for server in servers:
        code, details = asyncio.run(call(server))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith("request: not a AcquireRequest in protobuf's wire format")


def test_reflection_lists_the_lease_service_on_both_transports(
    servers: list[SluiceProcess],
) -> None:
    from grpc_reflection.v1alpha import reflection_pb2

    for server in servers:
        with grpc.insecure_channel(server.grpc_target) as channel:
            call = channel.stream_stream(
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
            )
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            [response] = call(iter([request]), timeout=5)
        assert "sluice.lease.v1.LeaseService" in {
            s.name for s in response.list_services_response.service
        }
