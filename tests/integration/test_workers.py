"""``sluice serve --workers N``: a supervisor and N worker processes on the same ports.

Real processes throughout. Which worker holds a connection is read from /proc (the
established socket's inode among a worker's file descriptors), so the tests can show that
both workers served, and which one answered a scrape.

The tests that serve run with both transports. Under grpcio a worker process serves; under
pyvoy a worker is a launcher and the Envoy it started (its child) holds the sockets, so the
tests look at "serving" processes: the workers themselves, or their Envoys.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.policies.store import PolicyStore
from sluice.usage.store import UsageStore
from tests.support.processes import SluiceProcess, run_sluice, sluice_serve, wait_until
from tests.support.procfs import children, socket_inodes, tcp_sockets
from tests.support.redis_servers import RedisProcess

LIMIT = 50
POLICY = f"""domain: w
descriptors:
  - key: exact
    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}}}
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: 1000000}}
"""
OK, OVER_LIMIT = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT


def connection_owners(port: int, pids: set[int]) -> dict[int, int]:
    """Established connections to ``port``: client port -> the pid (of ``pids``) holding it."""
    inodes = {pid: socket_inodes(pid) for pid in pids}
    owners = {}
    for local, remote, state, _, inode in tcp_sockets():
        if local == port and state == "01":
            for pid, held in inodes.items():
                if inode in held:
                    owners[remote] = pid
    return owners


def listening_pids(port: int, pids: set[int]) -> set[int]:
    inodes = {pid: socket_inodes(pid) for pid in pids}
    listening = {
        inode for local, _, state, _, inode in tcp_sockets() if local == port and state == "0A"
    }
    return {pid for pid, held in inodes.items() if held & listening}


def ready_workers(server: SluiceProcess) -> set[int]:
    """Worker pids the supervisor has logged as ready and that are its children now."""
    log = server.log()
    alive = children(server.process.pid)
    return {pid for pid in alive if f"ready (pid {pid})" in log}


def metrics_dir_of(pid: int) -> str:
    """The PROMETHEUS_MULTIPROC_DIR in a process's environment."""
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if entry.startswith(b"PROMETHEUS_MULTIPROC_DIR="):
            return entry.split(b"=", 1)[1].decode()
    raise AssertionError(f"no PROMETHEUS_MULTIPROC_DIR in process {pid}'s environment")


def serving_pid(worker: int, transport: str) -> int:
    """The process holding a worker's sockets: the worker, or (pyvoy) its Envoy."""
    if transport == "grpcio":
        return worker
    [envoy] = children(worker)
    return envoy


def serving(server: SluiceProcess, transport: str) -> dict[int, int]:
    """Ready workers' serving processes: serving pid -> worker pid."""
    return {serving_pid(worker, transport): worker for worker in ready_workers(server)}


# -- servers and calls ------------------------------------------------------------------------


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def workers_args(redis_url: str, *more: str) -> list[str]:
    return [
        "--workers", "2",
        "--backend", "redis",
        "--redis-url", redis_url,
        "--redis-key-prefix", f"w{uuid.uuid4().hex}:",
        # Exactness and processes are the subject, not timeouts (a busy 2-core machine).
        "--redis-timeout-ms", "1000",
        *more,
    ]  # fmt: skip


@pytest.fixture(params=["grpcio", "pyvoy"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def two_workers(
    tmp_path: Path, policy: Path, redis_server: str, transport: str
) -> Iterator[SluiceProcess]:
    args = workers_args(redis_server, "--transport", transport)
    with sluice_serve(tmp_path, config=policy, extra_args=args) as server:
        wait_until(lambda: len(ready_workers(server)) == 2, 60, "two workers ready")
        yield server


def request(key: str, value: str) -> rls_pb2.RateLimitRequest:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)
    return rls_pb2.RateLimitRequest(
        domain="w", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )


def channels(target: str, n: int) -> list[grpc.aio.Channel]:
    # A local subchannel pool: each channel its own TCP connection, which the kernel gives to
    # one worker or the other (channels to one target otherwise share a connection).
    return [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(n)
    ]


async def flood(
    server: SluiceProcess, workers: set[int], key: str, value: str, *, n_channels: int, n: int
) -> tuple[list[int], dict[int, int]]:
    """``n`` concurrent calls spread over ``n_channels`` connections: the answers, and which
    worker held each connection (read while they are open)."""
    open_channels = channels(server.grpc_target, n_channels)
    stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in open_channels]
    try:
        responses = await asyncio.gather(
            *(
                stubs[i % n_channels].ShouldRateLimit(request(key, value), timeout=10)
                for i in range(n)
            )
        )
        owners = connection_owners(server.grpc_port, workers)
    finally:
        for channel in open_channels:
            await channel.close()
    return [r.overall_code for r in responses], owners


def rule_hits(text: str) -> dict[str, float]:
    return {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "sluice_rule_hits"
        for sample in family.samples
        if sample.name == "sluice_rule_hits_total" and sample.labels["rule"] == "w.exact"
    }


def scrape(server: SluiceProcess, workers: set[int], path: str = "/metrics") -> tuple[int, str]:
    """GET ``path`` on a new connection: which worker answered, and what."""
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read().decode()
        assert response.status == 200
        # Keep-alive: the connection is still open, held by the worker that accepted it.
        client_port = connection.sock.getsockname()[1]
        return connection_owners(server.http_port, workers)[client_port], body
    finally:
        connection.close()


def usage_totals(database_url: str) -> tuple[int, int]:
    with PolicyStore(database_url) as store:
        points = UsageStore(store.database).series("w.exact", since_s=0).get("w.exact", [])
    return sum(p.allowed for p in points), sum(p.over_limit for p in points)


# -- tests --------------------------------------------------------------------------------------


def test_two_workers_on_redis_admit_exactly_the_limit_and_both_serve(
    two_workers: SluiceProcess, tmp_path: Path, transport: str
) -> None:
    server = two_workers
    workers = set(serving(server, transport))
    codes, owners = asyncio.run(flood(server, workers, "exact", "k", n_channels=40, n=200))

    assert (codes.count(OK), codes.count(OVER_LIMIT)) == (LIMIT, 200 - LIMIT)
    # Every channel's connection was held by a worker, and both workers held some: the calls
    # on a connection are answered by the worker holding it.
    assert len(owners) == 40
    assert set(owners.values()) == workers

    # /metrics adds the workers up, whichever answers: scrape on new connections until both
    # have answered, each scrape with the whole count.
    def counted(hits: dict[str, float]) -> float:
        return hits.get("allowed", 0) + hits.get("over_limit", 0)

    wait_until(
        lambda: counted(rule_hits(scrape(server, workers)[1])) >= 200,
        10,
        "the workers' rule hits in /metrics",
    )
    answered_by: dict[int, dict[str, float]] = {}
    for _ in range(200):
        pid, body = scrape(server, workers)
        answered_by[pid] = rule_hits(body)
        if answered_by.keys() == workers:
            break
    assert answered_by.keys() == workers
    for hits in answered_by.values():
        assert (hits["allowed"], hits["over_limit"]) == (LIMIT, 200 - LIMIT)

    # Usage telemetry: each worker adds its own figures to the same rows.
    database_url = f"sqlite:///{tmp_path / 'sluice.db'}"
    wait_until(lambda: sum(usage_totals(database_url)) >= 200, 10, "usage figures flushed")
    assert usage_totals(database_url) == (LIMIT, 200 - LIMIT)


def test_a_killed_worker_is_replaced_and_the_port_keeps_answering(
    two_workers: SluiceProcess, transport: str
) -> None:
    server = two_workers
    before = serving(server, transport)
    victim, survivor = sorted(before)
    metrics_dir = Path(metrics_dir_of(victim))
    assert {p.name for p in metrics_dir.glob(f"gauge_live*_{victim}.db")}  # what it wrote
    # grpcio: the worker itself; pyvoy: its Envoy (the launcher then ends, and is replaced).
    os.kill(victim, signal.SIGKILL)
    how = "was killed by SIGKILL" if transport == "grpcio" else "exited 1"
    # Reaped by the supervisor, so every thread is gone and its listening sockets closed (a
    # killed process's main thread is a zombie while its other threads still hold them).
    wait_until(
        lambda: f"(pid {before[victim]}) {how}; restarting it" in server.log(),
        10,
        "the supervisor to see the killed worker end",
    )

    # Its live gauges no longer count in /metrics (dropped by the supervisor, or under pyvoy
    # by the launcher, since the pid that wrote them is Envoy's).
    assert not list(metrics_dir.glob(f"gauge_live*_{victim}.db"))

    # Answered while the supervisor replaces it: new connections go to the listening sockets
    # that remain.
    codes, _ = asyncio.run(flood(server, {survivor}, "user", "a", n_channels=10, n=20))
    assert codes == [OK] * 20

    wait_until(lambda: len(ready_workers(server) - set(before.values())) == 1, 60, "a new worker")
    now = serving(server, transport)
    [replacement] = set(now) - set(before)
    assert set(now) == {survivor, replacement}

    # The replacement serves too (connections are spread by the kernel: a few rounds at most).
    workers = {survivor, replacement}
    served_by: set[int] = set()
    for _ in range(10):
        codes, owners = asyncio.run(flood(server, workers, "user", "b", n_channels=10, n=10))
        assert codes == [OK] * 10
        served_by |= set(owners.values())
        if replacement in served_by:
            break
    assert replacement in served_by


def test_a_published_policy_reaches_every_worker(
    two_workers: SluiceProcess, tmp_path: Path, transport: str
) -> None:
    server = two_workers
    workers = set(serving(server, transport))
    changed = tmp_path / "changed.yaml"
    changed.write_text(
        POLICY + "  - key: published\n    rate_limit: {unit: day, requests_per_unit: 7}\n"
    )
    database_url = f"sqlite:///{tmp_path / 'sluice.db'}"
    result = run_sluice(["import", str(changed), "--database-url", database_url])
    assert result.returncode == 0, result.stderr

    # Each worker polls the database on its own: ask /rlconfig on new connections (the kernel
    # picks the worker) until every worker has answered with the published rule.
    has_it: set[int] = set()

    def every_worker_has_it() -> bool:
        pid, body = scrape(server, workers, "/rlconfig")
        if "w.published" in body:
            has_it.add(pid)
        return has_it == workers

    wait_until(every_worker_has_it, 30, "the published rule in every worker")


def held_at_redis(server: SluiceProcess, workers: set[int], redis_port: int) -> bool:
    """Every worker has read what its clients sent, and has a script call waiting, unread,
    in the frozen Redis's socket."""
    sockets = tcp_sockets()
    if any(local == server.grpc_port and unread for local, _, _, unread, _ in sockets):
        return False
    for pid in workers:
        mine = socket_inodes(pid)
        ports = {
            local
            for local, remote, _, _, inode in sockets
            if remote == redis_port and inode in mine
        }
        if not any(
            local == redis_port and remote in ports and unread
            for local, remote, _, unread, _ in sockets
        ):
            return False
    return True


def test_sigterm_drains_every_worker_and_the_supervisor_exits_0(
    tmp_path: Path, policy: Path, private_redis: RedisProcess, transport: str
) -> None:
    grace_s = 8.0
    args = workers_args(
        private_redis.url,
        "--transport", transport,
        "--redis-timeout-ms", "15000",  # a frozen Redis holds calls, never fails them
        "--shutdown-grace-s", str(grace_s),
    )  # fmt: skip
    with sluice_serve(tmp_path, config=policy, extra_args=args) as server:
        wait_until(lambda: len(ready_workers(server)) == 2, 60, "two workers ready")
        workers = set(serving(server, transport))
        metrics_dirs = {metrics_dir_of(pid) for pid in workers}
        assert len(metrics_dirs) == 1 and Path(next(iter(metrics_dirs))).is_dir()

        async def scenario() -> tuple[list[object], list[object]]:
            open_channels = channels(server.grpc_target, 16)
            stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in open_channels]
            try:
                await asyncio.gather(*(s.ShouldRateLimit(request("user", "warm")) for s in stubs))
                # Each channel's connection, opened by its warm-up call, is held by a worker.
                owners = connection_owners(server.grpc_port, workers)
                assert len(owners) == 16 and set(owners.values()) == workers
                private_redis.freeze()
                try:
                    held = [
                        asyncio.ensure_future(
                            s.ShouldRateLimit(request("user", "held"), timeout=30)
                        )
                        for s in stubs
                    ]
                    await asyncio.to_thread(
                        wait_until,
                        lambda: held_at_redis(server, workers, private_redis.port),
                        10,
                        "calls held in both workers",
                    )
                    server.process.send_signal(signal.SIGTERM)
                    await asyncio.to_thread(
                        wait_until,
                        lambda: server.log().count("signal received: draining") == 2,
                        10,
                        "both workers draining",
                    )
                    assert not any(call.done() for call in held)
                    # Draining: a new call on any connection is refused, for a retry elsewhere.
                    refused = await asyncio.gather(
                        *(s.ShouldRateLimit(request("user", "new"), timeout=5) for s in stubs),
                        return_exceptions=True,
                    )
                finally:
                    private_redis.thaw()
                answers = await asyncio.gather(*held, return_exceptions=True)
                return answers, [
                    e.code() if isinstance(e, grpc.aio.AioRpcError) else e for e in refused
                ]
            finally:
                for channel in open_channels:
                    await channel.close()

        started = time.monotonic()
        answers, refused = asyncio.run(scenario())
        code = server.process.wait(grace_s + 10)
        log = server.log()

    assert [a.overall_code if isinstance(a, rls_pb2.RateLimitResponse) else a for a in answers] == [
        OK
    ] * 16
    assert refused == [grpc.StatusCode.UNAVAILABLE] * 16
    assert code == 0
    assert time.monotonic() - started < grace_s + 10
    assert log.count("stopped\n") >= 2 and "all workers stopped" in log
    assert not Path(next(iter(metrics_dirs))).exists()  # the supervisor removed it


def test_one_worker_is_the_process_started(tmp_path: Path, transport: str) -> None:
    args = ["--workers", "1", "--transport", transport]
    with sluice_serve(tmp_path, extra_args=args) as server:
        pid = server.process.pid
        # grpcio: this process serves both ports. pyvoy: its one child, Envoy, does (the
        # HTTP port from the app inside it), and Envoy starts nothing of its own.
        serving = pid if transport == "grpcio" else next(iter(children(pid)), -1)
        assert children(pid) == (set() if transport == "grpcio" else {serving})
        assert listening_pids(server.grpc_port, {pid, serving}) == {serving}
        assert listening_pids(server.http_port, {pid, serving}) == {serving}
        assert children(serving) == set()
    assert "sluice.workers" not in server.log()  # no supervisor


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--workers", "2", "--backend", "memory"],
            "sluice: --workers 2 needs --backend redis: with the memory backend each worker "
            "would keep its own counters and limits would not hold; use Redis, or --workers 1",
        ),
        (
            ["--workers", "2", "--transport", "pyvoy", "--backend", "memory"],
            "sluice: --workers 2 needs --backend redis: with the memory backend each worker "
            "would keep its own counters and limits would not hold; use Redis, or --workers 1",
        ),
        (
            ["--workers", "2", "--backend", "redis", "--grpc-port", "0"],
            "sluice: --grpc-port 0 (any free port) cannot be shared by --workers 2: "
            "give a port number",
        ),
    ],
)
def test_settings_that_cannot_run_as_workers_are_refused(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = run_sluice(["serve", "--database-url", f"sqlite:///{tmp_path / 's.db'}", *args])
    assert (result.returncode, result.stderr) == (2, message + "\n")
    assert not (tmp_path / "s.db").exists()  # refused before touching anything


def test_workers_that_cannot_start_stop_the_supervisor_with_their_exit_code(
    tmp_path: Path,
) -> None:
    # No config database and no snapshot cache: a single server exits 3; so do the workers.
    result = run_sluice(
        [
            "serve",
            "--workers",
            "2",
            "--backend",
            "redis",
            "--database-url",
            "postgresql://sluice@127.0.0.1:1/none",
            "--snapshot-cache",
            "",
        ],  # fmt: skip
        cwd=tmp_path,
    )
    assert result.returncode == 3, result.stderr
    assert "before serving: stopping" in result.stderr
    assert "sluice: config database:" in result.stderr


def test_a_single_pyvoy_server_does_not_share_its_port(tmp_path: Path) -> None:
    # Envoy sets SO_REUSEPORT by default on Linux; with one worker Sluice turns it off, so a
    # second server on the same port fails instead of taking half of the connections.
    with sluice_serve(tmp_path, extra_args=["--transport", "pyvoy"]) as server:
        second = run_sluice(
            [
                "serve",
                "--transport",
                "pyvoy",
                "--host",
                "127.0.0.1",
                "--grpc-port",
                str(server.grpc_port),
                "--http-port",
                "0",
                "--database-url",
                f"sqlite:///{tmp_path / 'second.db'}",
            ],  # fmt: skip
            cwd=tmp_path,
        )
        envoy = serving_pid(server.process.pid, "pyvoy")
        assert listening_pids(server.grpc_port, {envoy}) == {envoy}
    assert second.returncode == 1
    assert f"cannot bind '127.0.0.1:{server.grpc_port}': Address already in use" in second.stderr
