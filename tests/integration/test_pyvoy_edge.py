"""``sluice serve --transport pyvoy``: Sluice's gRPC port served by Envoy through pyvoy, called
by real grpcio clients. test_grpc_server.py and tests/abuse/test_request_fuzz.py run their
gRPC tests on this transport too; here: what only this transport needs checking (drain on
SIGTERM across two processes, deadlines, health Watch, many concurrent streams).

The drain and deadline tests hold a call inside Sluice honestly: Redis behind a proxy that
keeps what Sluice sends until the test lets it through (tests/support/holding_proxy.py).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tests.support.holding_proxy import HoldingProxy
from tests.support.processes import SluiceProcess, sluice_serve, wait_until
from tests.support.procfs import process_tree

POLICY = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
RLS_NAME = "envoy.service.ratelimit.v3.RateLimitService"
H2LOAD = "/usr/bin/h2load"


def request(domain: str, value: str = "v") -> rls_pb2.RateLimitRequest:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="k", value=value)
    return rls_pb2.RateLimitRequest(
        domain=domain, descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )


def metric(server: SluiceProcess, name: str, **labels: str) -> float:
    """One sample of the server's /metrics (0 when absent)."""
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample.startswith(name + "{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', sample[len(name) :]))
            if found == labels:
                return float(value)
    return 0.0


def decided(server: SluiceProcess, code: str) -> float:
    return metric(server, "sluice_request_duration_seconds_count", transport="grpc", code=code)


# --- one server on the memory backend -------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("pyvoy")
    config = workdir / "policy.yaml"
    config.write_text(POLICY)
    with sluice_serve(workdir, config=config, extra_args=["--transport", "pyvoy"]) as process:
        yield process
    assert process.process.returncode == 0, process.log()
    assert "Traceback" not in process.log(), process.log()


@pytest.fixture(scope="module")
def channel(server: SluiceProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_target) as ch:
        yield ch


def test_the_grpc_port_is_envoy(server: SluiceProcess) -> None:
    assert re.search(r"gRPC on 127\.0\.0\.1:\d+ \(Envoy, pid \d+, through pyvoy\)", server.log())


def test_gzip_compressed_request_is_decided(channel: grpc.Channel) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    response = stub.ShouldRateLimit(
        request("d", "gzip"), compression=grpc.Compression.Gzip, timeout=5
    )
    assert response.statuses[0].limit_remaining == 4


def test_unknown_method_is_unimplemented(channel: grpc.Channel) -> None:
    for path in (f"/{RLS_NAME}/ShouldNot", "/some.Other/ShouldRateLimit"):
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(path)(b"", timeout=5)
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_oversized_message_is_resource_exhausted(channel: grpc.Channel) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.ShouldRateLimit(request("d", "x" * (5 * 1024 * 1024)), timeout=10)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.ShouldRateLimit(request("d", "after"), timeout=5).overall_code == 1


@pytest.mark.parametrize("service", ["", "ratelimit", RLS_NAME])
def test_health_check_and_watch_say_serving(channel: grpc.Channel, service: str) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    check = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=5)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


def test_health_of_an_unknown_service(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    watch.cancel()


def test_reflection_v1_answers_as_v1alpha(channel: grpc.Channel) -> None:
    # v1's messages are v1alpha's on the wire: grpcurl and newer clients ask v1 first.
    from grpc_reflection.v1alpha import reflection_pb2

    call = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    [response] = call(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = {s.name for s in response.list_services_response.service}
    assert {RLS_NAME, "grpc.health.v1.Health"} <= names


def test_hundreds_of_concurrent_streams_all_decided_in_bounded_memory(
    server: SluiceProcess, tmp_path: Path
) -> None:
    body = tmp_path / "body.bin"
    message = request("d", "h2load").SerializeToString()
    body.write_bytes(b"\x00" + len(message).to_bytes(4, "big") + message)
    calls = 20_000

    def load() -> None:
        result = subprocess.run(
            [
                H2LOAD,
                *("-n", str(calls), "-c", "4", "-m", "200"),  # 800 streams open at once
                *("-H", "content-type: application/grpc", "-H", "te: trailers"),
                *("-d", str(body)),
                f"http://{server.grpc_target}/{RLS_NAME}/ShouldRateLimit",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"{calls} succeeded, 0 failed, 0 errored, 0 timeout" in result.stdout, result.stdout

    before = decided(server, "OK") + decided(server, "OVER_LIMIT")
    load()
    # h2load sees HTTP statuses only: every call was decided (grpc-status 0), says Sluice.
    assert decided(server, "OK") + decided(server, "OVER_LIMIT") - before == calls
    # Bounded memory: a second round of the same load leaves the server (the launcher and
    # Envoy with Sluice inside) no bigger than the first did, give or take allocator slack.
    first = rss_mib(process_tree(server.process.pid))
    load()
    second = rss_mib(process_tree(server.process.pid))
    assert second - first < 16, (first, second)


def rss_mib(pids: set[int]) -> float:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


# --- Redis behind a proxy that holds calls: drain and deadlines -----------------------------------


@pytest.fixture
def held_redis(redis_server: str) -> Iterator[HoldingProxy]:
    host, port = redis_server.removeprefix("redis://").split("/")[0].split(":")
    proxy = HoldingProxy(host, int(port))
    yield proxy
    proxy.close()


@pytest.fixture
def redis_sluice(held_redis: HoldingProxy, tmp_path: Path) -> Iterator[SluiceProcess]:
    config = tmp_path / "policy.yaml"
    config.write_text(POLICY)
    args = [
        *("--transport", "pyvoy", "--backend", "redis"),
        *("--redis-url", f"redis://127.0.0.1:{held_redis.port}/0"),
        *("--redis-key-prefix", f"pyvoy-{tmp_path.name}-"),
        *("--redis-timeout-ms", "30000", "--shutdown-grace-s", "10"),
    ]
    with sluice_serve(tmp_path, config=config, extra_args=args) as process:
        with grpc.insecure_channel(process.grpc_target) as channel:
            # Connects to Redis and loads the script, so a held call holds only its own bytes.
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            stub.ShouldRateLimit(request("d", "warm"), timeout=10)
        yield process


async def drain_scenario(
    server: SluiceProcess, proxy: HoldingProxy, calls: int
) -> tuple[Counter[tuple[str, str]], rls_pb2.RateLimitResponse, list[int]]:
    async with grpc.aio.insecure_channel(server.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=30
        )
        statuses = [(await health.read()).status]
        proxy.hold()
        in_flight = asyncio.ensure_future(stub.ShouldRateLimit(request("d"), timeout=20))
        async with asyncio.timeout(10):
            while proxy.held_bytes == 0:  # its Redis call has left Sluice: surely in flight
                await asyncio.sleep(0.01)
        server.process.send_signal(15)  # SIGTERM: the launcher asks the app to drain

        async def probe() -> tuple[str, str]:
            try:  # a domain without rules never reaches Redis
                await stub.ShouldRateLimit(request("unknown"), timeout=5)
            except grpc.aio.AioRpcError as exc:
                return exc.code().name, exc.details()
            return "OK", ""

        first = ("OK", "")
        async with asyncio.timeout(10):
            while first == ("OK", ""):  # answered until the drain begins
                first = await probe()
        outcomes = Counter([first, *await asyncio.gather(*(probe() for _ in range(calls)))])
        statuses.append((await health.read()).status)
        assert not in_flight.done()
        proxy.release()
        response = await in_flight
        health.cancel()
    return outcomes, response, statuses


def test_sigterm_drains_in_flight_calls_and_refuses_new_ones(
    redis_sluice: SluiceProcess, held_redis: HoldingProxy
) -> None:
    outcomes, response, statuses = asyncio.run(drain_scenario(redis_sluice, held_redis, 200))
    # Every call refused while draining is refused by Sluice with UNAVAILABLE (safe to retry
    # elsewhere: nothing was counted), none cancelled by the transport.
    assert outcomes == {("UNAVAILABLE", "shutting down: retry on another instance"): 201}
    assert response.overall_code == rls_pb2.RateLimitResponse.OK
    assert response.statuses[0].limit_remaining == 4
    assert statuses == [
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    ]
    assert redis_sluice.process.wait(20) == 0
    log = redis_sluice.log()
    assert "drained" in log and log.rstrip().endswith("stopped"), log


def test_a_call_past_its_deadline_is_not_decided(
    redis_sluice: SluiceProcess, held_redis: HoldingProxy
) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(redis_sluice.grpc_target))
    errors_before = decided(redis_sluice, "error")
    held_redis.hold()
    first: list[object] = []
    thread = threading.Thread(
        target=lambda: first.append(stub.ShouldRateLimit(request("d"), timeout=20))
    )
    thread.start()
    wait_until(lambda: held_redis.held_bytes > 0, 10, "the first call to reach Redis")
    # Queued behind the held call: its deadline passes inside Sluice, before Redis. A second
    # is ample time to reach the server on a busy machine (a 1 ms deadline could pass in the
    # client, and the server would never see the call), and the held call keeps it queued.
    with pytest.raises(grpc.RpcError) as info:
        stub.ShouldRateLimit(request("d"), timeout=1.0)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    # The server saw the call and ended it undecided (the latency metric's "error" outcome).
    wait_until(
        lambda: decided(redis_sluice, "error") == errors_before + 1, 10, "the call to be ended"
    )
    held_redis.release()
    thread.join(20)
    assert first[0].statuses[0].limit_remaining == 4  # type: ignore[attr-defined]
    # 5 per hour: the first call and this one counted; the expired one did not.
    assert stub.ShouldRateLimit(request("d"), timeout=10).statuses[0].limit_remaining == 3
