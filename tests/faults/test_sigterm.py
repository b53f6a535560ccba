"""SIGTERM to a server under load: the calls it holds complete, and clients that retry once on
another instance see no error at all.

Two ``sluice serve`` processes share one SQLite config database and one Redis (so a call
retried on the other instance meets the same counters). Many concurrent grpc.aio calls run
against both; a call refused with UNAVAILABLE (a draining server, a refused connection) is
retried once on the other instance, which is what Envoy's retry policy or a client-side
balancer does.

To have calls that are certainly inside server A when the signal arrives, Redis is frozen
(SIGSTOP) first: A's rule-bearing calls then wait on their script call, which the test sees
queued, unread, in Redis's socket (``/proc/net/tcp``), while A has read every byte its
clients sent. A is sent SIGTERM, the test watches A refuse new calls and report not-serving
for as long as it holds the frozen ones, then thaws Redis: the held calls must complete with
their answers from A, and A must exit 0 within its grace period. No call may fail, CANCELLED
included: grpc's own server shutdown gives that to calls arriving while it runs, and clients
do not retry it, so a draining Sluice refuses new calls itself (UNAVAILABLE) and leaves its
connections to the process exit.

Reproduce the numbers: ``.venv/bin/python -m pytest -s tests/faults/test_sigterm.py``.
"""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.error
import urllib.request
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tests.support.processes import SluiceProcess, sluice_serve, wait_until
from tests.support.procfs import process_tree, socket_inodes, tcp_sockets
from tests.support.redis_servers import RedisProcess

GRACE_S = 8.0
POLICY = """domain: load
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000}
"""
SLOW_WORKERS = 24  # rule-bearing calls: they go to Redis, so a frozen Redis holds them
FAST_WORKERS = 8  # calls no rule applies to: answered without Redis, even while it is frozen
PACE_S = 0.05  # between one worker's calls


def request(key: str, value: str) -> rls_pb2.RateLimitRequest:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)
    return rls_pb2.RateLimitRequest(
        domain="load", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )


@dataclass(eq=False)
class Call:
    kind: str  # "slow" or "fast"
    primary: str  # "a" or "b"
    started: float
    ended: float = 0.0
    answered_by: str = ""  # who answered, once answered
    first_error: str = ""  # the primary's refusal, when retried
    error: str = ""  # what reached the caller: must stay empty


@dataclass
class Load:
    stubs: dict[str, rls_pb2_grpc.RateLimitServiceStub]
    calls: list[Call] = field(default_factory=list)
    outstanding: set[Call] = field(default_factory=set)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    async def call(self, kind: str, primary: str) -> None:
        other = "b" if primary == "a" else "a"
        value = f"u{len(self.calls)}"
        call = Call(kind, primary, time.monotonic())
        self.calls.append(call)
        self.outstanding.add(call)
        key = "user" if kind == "slow" else "anonymous"
        try:
            for attempt, target in enumerate((primary, other)):
                try:
                    response = await self.stubs[target].ShouldRateLimit(
                        request(key, value), timeout=15
                    )
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.UNAVAILABLE and attempt == 0:
                        call.first_error = f"{exc.code().name}: {exc.details()}"
                        continue
                    call.error = f"{target}: {exc.code().name}: {exc.details()}"
                    return
                if response.overall_code != rls_pb2.RateLimitResponse.OK:
                    call.error = f"{target}: answered {response.overall_code}"
                call.answered_by = target
                return
        finally:
            call.ended = time.monotonic()
            self.outstanding.discard(call)

    async def worker(self, kind: str, primary: str) -> None:
        while not self.stopping.is_set():
            await self.call(kind, primary)
            await asyncio.sleep(PACE_S)

    def answered(self) -> int:
        return sum(1 for c in self.calls if c.answered_by)


def holds_calls_on_redis(server: SluiceProcess, redis_port: int) -> bool:
    """``server`` has read every call its clients sent, and a script call of its own waits,
    unread, in the frozen Redis's socket."""
    sockets = [s for s in tcp_sockets() if s[2] == "01"]  # established
    if any(local == server.grpc_port and unread for local, _, _, unread, _ in sockets):
        return False
    # The process started and its children: under pyvoy, Envoy holds the Redis connections.
    mine = set().union(*map(socket_inodes, process_tree(server.process.pid)))
    ports = {
        local for local, remote, *_, inode in sockets if remote == redis_port and inode in mine
    }
    return any(
        local == redis_port and remote in ports and unread
        for local, remote, _, unread, _ in sockets
    )


def healthcheck(server: SluiceProcess) -> int:
    try:
        with urllib.request.urlopen(server.http_url + "/healthcheck", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # gone


@dataclass
class Timeline:
    in_flight: list[Call] = field(default_factory=list)  # A's rule-bearing calls at SIGTERM
    held: list[Call] = field(default_factory=list)  # of those, the ones still open at the thaw
    refused_while_held: int = 0
    health_while_held: int = 0
    term: float = 0.0
    thaw: float = 0.0
    exit: float = 0.0
    exit_code: int | None = None


async def scenario(
    servers: dict[str, SluiceProcess], redis: RedisProcess, load: Load, timeline: Timeline
) -> None:
    a = servers["a"]

    async def until(predicate, timeout_s: float, what: str) -> None:
        await asyncio.to_thread(wait_until, predicate, timeout_s, what, 0.005)

    workers = [
        asyncio.ensure_future(load.worker(kind, primary))
        for kind, count in (("slow", SLOW_WORKERS), ("fast", FAST_WORKERS))
        for primary in ("a", "b")
        for _ in range(count // 2)
    ]
    try:
        answered = load.answered()
        await _poll(lambda: load.answered() >= answered + 300, 20, "load before the signal")

        redis.freeze()
        await _poll(
            lambda: sum(c.kind == "slow" for c in load.outstanding) == SLOW_WORKERS,
            10,
            "every slow call to wait on the frozen Redis",
        )
        await until(lambda: holds_calls_on_redis(a, redis.port), 10, "a's calls held at Redis")
        timeline.in_flight = [c for c in load.outstanding if c.kind == "slow" and c.primary == "a"]
        timeline.term = time.monotonic()
        a.process.send_signal(signal.SIGTERM)

        # Draining: new calls refused (and retried elsewhere), health not-serving, while the
        # held calls are still inside A.
        def refused_since_term() -> int:
            return sum(
                1
                for c in load.calls
                if c.primary == "a" and c.started > timeline.term and c.first_error
            )

        await _poll(lambda: refused_since_term() >= 5, 10, "a to refuse new calls")
        await until(lambda: healthcheck(a) == 500, 10, "a's health to report draining")
        assert a.process.poll() is None
        timeline.refused_while_held = refused_since_term()
        timeline.health_while_held = healthcheck(a)

        # Still open now, with Redis frozen all along: these were waiting inside A, or (if A
        # refused them as it began draining) inside B. Calls A had answered just before the
        # freeze, but the client had not read yet, are the only ones that could have ended.
        timeline.held = [c for c in timeline.in_flight if c in load.outstanding]
        redis.thaw()
        timeline.thaw = time.monotonic()
        timeline.exit_code = await asyncio.to_thread(a.process.wait, GRACE_S + 10)
        timeline.exit = time.monotonic()
        answered = load.answered()
        await _poll(lambda: load.answered() >= answered + 150, 20, "load after a exited")
    finally:
        redis.thaw()
        load.stopping.set()
        await asyncio.gather(*workers, return_exceptions=True)


async def _poll(predicate, timeout_s: float, what: str) -> None:
    """Wait, letting the load run, until ``predicate()``: a readiness wait, not a race fix."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.005)


async def run(servers: dict[str, SluiceProcess], redis: RedisProcess, timeline: Timeline) -> Load:
    channels = {name: grpc.aio.insecure_channel(s.grpc_target) for name, s in servers.items()}
    load = Load({name: rls_pb2_grpc.RateLimitServiceStub(c) for name, c in channels.items()})
    try:
        await scenario(servers, redis, load, timeline)
    finally:
        for channel in channels.values():
            await channel.close()
    return load


def test_sigterm_under_load_completes_held_calls_and_no_error_reaches_clients(
    tmp_path: Path,
) -> None:
    database_url = f"sqlite:///{tmp_path / 'config.db'}"
    (tmp_path / "policy.yaml").write_text(POLICY)
    redis = RedisProcess(tmp_path / "redis")
    timeline = Timeline()
    try:
        redis.start()
        with ExitStack() as stack:
            servers = {}
            for name in ("a", "b"):
                workdir = tmp_path / name
                workdir.mkdir()
                args = [
                    "--backend", "redis",
                    "--redis-url", redis.url,
                    "--redis-timeout-ms", "15000",  # a frozen Redis holds calls, never fails them
                    "--shutdown-grace-s", str(GRACE_S),
                    "--snapshot-cache", str(workdir / "cache.json"),
                ]  # fmt: skip
                servers[name] = stack.enter_context(
                    sluice_serve(
                        workdir,
                        database_url=database_url,
                        # A imports the policy as it starts; B, started after, serves it too.
                        config=tmp_path / "policy.yaml" if name == "a" else None,
                        extra_args=args,
                    )
                )
            load = asyncio.run(run(servers, redis, timeline))
            a_log = servers["a"].log()
    finally:
        redis.kill()

    after_term = [c for c in load.calls if c.started >= timeline.term]
    retried = [c for c in load.calls if c.first_error]
    errors = [c for c in load.calls if c.error]
    completed_by_a = [c for c in timeline.held if c.answered_by == "a" and not c.first_error]
    print(
        f"\ncalls {len(load.calls)} (slow {sum(c.kind == 'slow' for c in load.calls)}, fast "
        f"{sum(c.kind == 'fast' for c in load.calls)}), {len(after_term)} started after SIGTERM; "
        f"retried on the other instance {len(retried)} "
        f"({dict(Counter(c.first_error.split(';')[0][:60] for c in retried))}); "
        f"failed {len(errors)}"
        f"\nA's calls in flight at SIGTERM {len(timeline.in_flight)}, held until Redis was "
        f"thawed {len(timeline.held)}: completed by A {len(completed_by_a)}, refused by A and "
        f"retried {len(timeline.held) - len(completed_by_a)}; A refused "
        f"{timeline.refused_while_held} new calls and answered /healthcheck "
        f"{timeline.health_while_held} while holding them"
        f"\nA exited {timeline.exit_code}: {timeline.exit - timeline.term:.2f} s after SIGTERM, "
        f"{timeline.exit - timeline.thaw:.2f} s after its calls could complete "
        f"(grace {GRACE_S:.0f} s)"
    )
    assert [(c.kind, c.primary, round(c.started - timeline.term, 3), c.error) for c in errors] == []
    assert len(completed_by_a) >= 1
    assert all(c.ended > timeline.thaw for c in completed_by_a)
    assert timeline.refused_while_held >= 5
    assert timeline.health_while_held == 500
    assert timeline.exit_code == 0
    assert timeline.exit - timeline.term < GRACE_S
    assert all(c.answered_by == "b" for c in load.calls if c.started > timeline.exit)
    assert "signal received: draining" in a_log and "stopped" in a_log
