"""Two `sluice serve` processes on one Redis (standalone and Cluster) admit exactly the limit
under 200 concurrent gRPC requests split between them, whatever the algorithm."""

from __future__ import annotations

import asyncio
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tests.support.processes import SluiceProcess, sluice_serve

LIMIT = 50
ALGORITHMS = ("fixed_window", "sliding_window_log", "sliding_window_counter", "gcra")
POLICY = "domain: exact\ndescriptors:\n" + "".join(
    f"  - key: {algorithm}\n"
    f"    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, algorithm: {algorithm}"
    + (f", burst: {LIMIT}" if algorithm == "gcra" else "")
    + "}\n"
    for algorithm in ALGORITHMS
)


@pytest.fixture(scope="module", params=["standalone", "cluster"])
def servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[SluiceProcess]]:
    url = request.getfixturevalue(
        "redis_server" if request.param == "standalone" else "redis_cluster"
    )
    workdir = tmp_path_factory.mktemp("exact")
    config = workdir / "policy.yaml"
    config.write_text(POLICY)
    args = ["--backend", "redis", "--redis-url", url, "--redis-key-prefix", f"x{uuid.uuid4().hex}:"]
    # Exactness is the subject here, not timeouts: on a busy 2-core machine the event loop can
    # stall past the default 100 ms and fail a call that Redis answered (faults are tested in
    # tests/faults with their own timeouts).
    args += ["--redis-timeout-ms", "1000"]
    with ExitStack() as stack:
        # The first imports the policy; both then serve it from the shared database.
        first = stack.enter_context(sluice_serve(workdir, config=config, extra_args=args))
        second = stack.enter_context(
            sluice_serve(_sub(workdir), database_url=_db(workdir), extra_args=args)
        )
        yield [first, second]


def _sub(workdir: Path) -> Path:
    path = workdir / "second"
    path.mkdir(exist_ok=True)
    return path


def _db(workdir: Path) -> str:
    return f"sqlite:///{workdir / 'sluice.db'}"


async def _flood(servers: list[SluiceProcess], key: str, value: str, n: int) -> list[int]:
    channels = [grpc.aio.insecure_channel(s.grpc_target) for s in servers]
    stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)
    message = rls_pb2.RateLimitRequest(
        domain="exact", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )
    try:
        responses = await asyncio.gather(
            *(stubs[i % len(stubs)].ShouldRateLimit(message, timeout=10) for i in range(n))
        )
    finally:
        for channel in channels:
            await channel.close()
    return [response.overall_code for response in responses]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_exactly_the_limit_is_admitted(servers: list[SluiceProcess], algorithm: str) -> None:
    codes = asyncio.run(_flood(servers, algorithm, uuid.uuid4().hex, 200))
    assert codes.count(rls_pb2.RateLimitResponse.OK) == LIMIT
    assert codes.count(rls_pb2.RateLimitResponse.OVER_LIMIT) == 200 - LIMIT


def _metrics(server: SluiceProcess) -> dict[str, float]:
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    return {
        line.split()[0]: float(line.split()[1])
        for line in lines
        if line.startswith("sluice_") and not line.startswith("#")
    }


def test_a_known_over_limit_key_costs_redis_nothing_and_metrics_say_so(
    servers: list[SluiceProcess],
) -> None:
    value = uuid.uuid4().hex
    asyncio.run(_flood(servers, "gcra", value, 200))  # now over its limit for a while
    before = _metrics(servers[0])
    codes = asyncio.run(_flood(servers[:1], "gcra", value, 20))
    after = _metrics(servers[0])
    assert codes == [rls_pb2.RateLimitResponse.OVER_LIMIT] * 20
    refused = (
        after["sluice_local_cache_refusals_total"] - before["sluice_local_cache_refusals_total"]
    )
    assert refused == 20
    assert after["sluice_redis_round_trips_total"] == before["sluice_redis_round_trips_total"]
    assert after["sluice_redis_circuit_open"] == 0
