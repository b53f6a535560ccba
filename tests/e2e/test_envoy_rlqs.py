"""End to end: examples/envoy/rlqs.yaml, a real Envoy enforcing the token buckets `sluice serve`
(examples/envoy/rlqs-policy.yaml) assigns it over Envoy's Rate Limit Quota Service stream.

Only the ports are rewritten. Load is paced (a fixed number of requests a second from one
thread per Envoy, on a keep-alive connection), so the admitted counts can be compared with the
rule's rate. Each test uses its own tenant, so its bucket is new: Envoy's first request in it
passes (no_assignment_behavior ALLOW_ALL) and opens the stream, and the 429s start once
Sluice's first assignment has arrived.

Counting starts at the first 429 (the bucket just ran dry), so what is admitted in the next
10 s is the assigned fill rate, not the initial burst.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.envoy import EnvoyProcess, envoy_binary, envoy_serve
from tests.support.envoy_example import EXAMPLES, example_config, upstream_server
from tests.support.processes import SluiceProcess, free_port, sluice_serve, wait_until
from tests.support.redis_servers import RedisProcess

pytestmark = pytest.mark.e2e

ENVOY_CONFIG = EXAMPLES / "rlqs.yaml"
POLICY = EXAMPLES / "rlqs-policy.yaml"
# The ports written in examples/envoy/rlqs.yaml.
WRITTEN = (10000, 9903, 8000, 8081)
LIMIT_PER_S = 20  # rlqs-policy.yaml's rate for any tenant
ANONYMOUS_LIMIT_PER_S = 5  # its rate for every request without x-tenant, together
WINDOW_S = 10.0
TOLERANCE = 0.10


@dataclass
class PacedLoad:
    """GETs at ``rate_per_s`` to one Envoy for one tenant, on a thread: (time, status) each."""

    port: int
    tenant: str | None  # None: no x-tenant header
    rate_per_s: float
    results: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PacedLoad:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)

    def _run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        headers = {} if self.tenant is None else {"x-tenant": self.tenant}
        start = time.monotonic()
        sent = 0
        while not self._stop.is_set():
            # A fixed schedule: a slow answer is caught up on, not lost from the rate.
            self._stop.wait(max(0.0, start + sent / self.rate_per_s - time.monotonic()))
            sent += 1
            try:
                connection.request("GET", "/", headers=headers)
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                status = 0  # counted apart: neither admitted nor refused
            self.results.append((time.monotonic(), status))
        connection.close()

    def first(self, status: int, after: float = 0.0) -> float | None:
        return next((t for t, s in list(self.results) if s == status and t >= after), None)

    def count(self, status: int, start: float, end: float) -> int:
        return sum(1 for t, s in list(self.results) if s == status and start <= t < end)

    def wait_for(self, status: int, timeout_s: float, after: float = 0.0) -> float:
        wait_until(lambda: self.first(status, after) is not None, timeout_s, f"a {status}")
        found = self.first(status, after)
        assert found is not None
        return found


def _metric(sluice: SluiceProcess, name: str) -> float:
    """The sum of every sample of ``name`` on Sluice's /metrics (0 when absent)."""
    with urllib.request.urlopen(f"{sluice.http_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def _within(admitted: int, expected: float) -> bool:
    return abs(admitted - expected) <= TOLERANCE * expected


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    with upstream_server() as port:
        yield port


@dataclass
class Proxy:
    envoy: EnvoyProcess
    port: int  # its listener


@contextlib.contextmanager
def _envoy(workdir: Path, upstream: int, sluice_grpc_port: int) -> Iterator[Proxy]:
    listener, admin = free_port(), free_port()
    config = example_config(
        ENVOY_CONFIG,
        listener=listener,
        admin=admin,
        upstream=upstream,
        sluice=sluice_grpc_port,
        written=WRITTEN,
    )
    with envoy_serve(workdir, config, admin_port=admin, listener_ports=(listener,)) as envoy:
        yield Proxy(envoy, listener)


def _diagnostics(*processes: Proxy | SluiceProcess) -> str:
    logs = [p.envoy if isinstance(p, Proxy) else p for p in processes]
    return "\n".join(f"--- {p.log_path.name} ---\n{p.log()}" for p in logs)


@pytest.fixture(autouse=True)
def _need_envoy() -> None:
    try:
        envoy_binary()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))  # never a skip: a missing Envoy must not pass as green


@dataclass
class Stack:
    sluice: SluiceProcess
    proxy: Proxy


@pytest.fixture(scope="module")
def stack(upstream: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("envoy-rlqs")
    with (
        sluice_serve(workdir, config=POLICY) as sluice,
        _envoy(workdir, upstream, sluice.grpc_port) as proxy,
    ):
        yield Stack(sluice, proxy)


def test_envoy_enforces_the_assigned_rate_with_a_handful_of_messages(stack: Stack) -> None:
    sluice = stack.sluice
    reports_before = _metric(sluice, "sluice_rlqs_reports_total")
    with PacedLoad(stack.proxy.port, f"t-{uuid.uuid4().hex}", 3 * LIMIT_PER_S) as load:
        first_refusal = load.wait_for(429, 10)
        # Before the first assignment, Envoy let the bucket's requests through.
        assert load.results[0][1] == 200, load.results[:5]
        wait_until(lambda: time.monotonic() >= first_refusal + WINDOW_S, WINDOW_S + 5, "")
    reports = _metric(sluice, "sluice_rlqs_reports_total") - reports_before
    should_rate_limit_calls = _metric(sluice, "sluice_request_duration_seconds_count")

    admitted = load.count(200, first_refusal, first_refusal + WINDOW_S)
    refused = load.count(429, first_refusal, first_refusal + WINDOW_S)
    assert load.count(0, 0, float("inf")) == 0, _diagnostics(stack.proxy, sluice)
    assert _within(admitted, LIMIT_PER_S * WINDOW_S), (admitted, refused)
    assert refused > admitted  # offered 3x the limit
    # One stream, a report every 5 s (and one at once): a handful of messages for more than
    # a thousand requests, and not one ShouldRateLimit call.
    assert 1 <= reports <= 2 + (WINDOW_S + 10) / 5, reports
    assert len(load.results) > 50 * reports
    assert should_rate_limit_calls == 0


def test_requests_without_a_tenant_share_the_anonymous_bucket(stack: Stack) -> None:
    window_s = 4.0
    with PacedLoad(stack.proxy.port, None, 4 * ANONYMOUS_LIMIT_PER_S) as load:
        first_refusal = load.wait_for(429, 10)
        wait_until(lambda: time.monotonic() >= first_refusal + window_s, window_s + 5, "")
    admitted = load.count(200, first_refusal, first_refusal + window_s)
    expected = ANONYMOUS_LIMIT_PER_S * window_s
    assert expected * 0.8 <= admitted <= expected * 1.2, admitted


@dataclass
class Pair:
    """Two Envoys on one bucket: a busy one offering 3x the limit, a quiet one offering 1x."""

    backend: str
    sluices: list[SluiceProcess]
    busy: PacedLoad
    quiet: PacedLoad
    proxies: tuple[Proxy, Proxy]

    def check(self, start: float, end: float) -> None:
        busy, quiet = self.busy.count(200, start, end), self.quiet.count(200, start, end)
        what = f"{self.backend}: busy admitted {busy}, quiet {quiet}"
        assert self.busy.count(0, 0, float("inf")) + self.quiet.count(0, 0, float("inf")) == 0
        processes = (*self.proxies, *{id(s): s for s in self.sluices}.values())
        assert busy + quiet <= LIMIT_PER_S * WINDOW_S * (1 + TOLERANCE), (
            what,
            _diagnostics(*processes),
        )
        # Not starved either: together they get most of the limit.
        assert busy + quiet >= LIMIT_PER_S * WINDOW_S * (1 - 2 * TOLERANCE), what
        assert busy > quiet > 0, what


def _pair(
    stack: contextlib.ExitStack,
    backend: str,
    sluices: list[SluiceProcess],
    workdir: Path,
    upstream: int,
) -> Pair:
    proxies = tuple(stack.enter_context(_envoy(workdir, upstream, s.grpc_port)) for s in sluices)
    tenant = f"t-{uuid.uuid4().hex}"
    busy = stack.enter_context(PacedLoad(proxies[0].port, tenant, 3 * LIMIT_PER_S))
    quiet = stack.enter_context(PacedLoad(proxies[1].port, tenant, LIMIT_PER_S))
    return Pair(backend, sluices, busy, quiet, (proxies[0], proxies[1]))


def test_two_envoys_share_one_limit_by_demand(
    tmp_path: Path, upstream: int, private_redis: RedisProcess
) -> None:
    """Two pairs of Envoys at once (one measuring window for both, to keep the run short).
    Memory: both Envoys stream to one Sluice. Redis: each to its own Sluice (one per
    transport), the two sharing one private Redis."""
    with contextlib.ExitStack() as stack:
        memory_dir, redis_dir = tmp_path / "memory", tmp_path / "redis"
        memory_dir.mkdir()
        memory_sluice = stack.enter_context(sluice_serve(memory_dir, config=POLICY))
        redis_sluices = []
        for transport in ("pyvoy", "grpcio"):
            workdir = redis_dir / transport
            workdir.mkdir(parents=True)
            args = ["--backend", "redis", "--redis-url", private_redis.url]
            args += ["--transport", transport]
            redis_sluices.append(
                stack.enter_context(sluice_serve(workdir, config=POLICY, extra_args=args))
            )
        pairs = [
            _pair(stack, "memory", [memory_sluice, memory_sluice], memory_dir, upstream),
            _pair(stack, "redis", redis_sluices, redis_dir, upstream),
        ]
        refusing = max(
            max(pair.busy.wait_for(429, 10), pair.quiet.wait_for(429, 15)) for pair in pairs
        )
        # Shares follow the demand each Envoy reports. Both streams opened with the load, so
        # their first report with a rate lands 5 s later, and the new shares reach both
        # Envoys within a second of it.
        start = refusing + 7
        end = start + WINDOW_S
        wait_until(lambda: time.monotonic() >= end, end - time.monotonic() + 5, "the window")

    for pair in pairs:
        pair.check(start, end)


def test_sluice_stopped_then_back_without_restarting_envoy(tmp_path: Path, upstream: int) -> None:
    """The config's expired_assignment_behavior is ALLOW_ALL: once the last assignment's TTL
    has run out with Sluice away, Envoy lets every request through; Sluice back on its port,
    Envoy's next 5 s tick opens a new stream and the limit is enforced again."""
    # Above Envoy's 5 s report tick, so assignments never lapse between reports.
    ttl_s = 7
    args = ["--rlqs-assignment-ttl-s", str(ttl_s)]
    ports = (free_port(), free_port())
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(
            sluice_serve(tmp_path, config=POLICY, extra_args=args, ports=ports)
        )
        envoy = stack.enter_context(_envoy(tmp_path, upstream, first.grpc_port))
        envoy_pid = envoy.envoy.process.pid
        load = stack.enter_context(PacedLoad(envoy.port, f"t-{uuid.uuid4().hex}", 40))
        load.wait_for(429, 10)

        stopping = time.monotonic()
        assert first.terminate() == 0, first.log()
        stopped = time.monotonic()
        # Past the TTL (counted from Sluice's exit, so certainly past) every request passes.
        open_from = stopped + ttl_s
        wait_until(lambda: time.monotonic() >= open_from + 2, ttl_s + 10, "the TTL to pass")
        # Before it, the last assignment held: it was refreshed at most one 5 s report tick
        # before Sluice began to stop, so it was still refusing for a second.
        assert load.count(429, stopping, stopping + 1) > 0, _diagnostics(envoy, first)
        assert load.count(429, open_from, open_from + 2) == 0, _diagnostics(envoy, first)
        assert load.count(200, open_from, open_from + 2) > 60

        back_dir = tmp_path / "back"
        back_dir.mkdir()
        back = stack.enter_context(
            sluice_serve(back_dir, config=POLICY, extra_args=args, ports=ports)
        )
        restarted = time.monotonic()
        # Envoy retries its stream on the next 5 s tick; the new assignment refuses again.
        load.wait_for(429, 5 + 5, after=restarted)
        assert envoy.envoy.process.pid == envoy_pid and envoy.envoy.process.poll() is None
        assert _metric(back, "sluice_rlqs_reports_total") >= 1
        assert (
            envoy.envoy.counters(r"cluster\.sluice\.upstream_rq_total")[
                "cluster.sluice.upstream_rq_total"
            ]
            >= 2
        )  # the same Envoy opened a second stream
