"""One benchmark run: Sluice against the Go reference (envoyproxy/ratelimit) and against a
no-op ShouldRateLimit handler on each transport, all measured in the same run.

Each target is started pinned to one core (``--server-cpu``), the load runs on another
(``--load-cpu``). Per target: a warm-up, a closed-loop peak (requests/s, server CPU per call,
Redis CPU and commands per call), then an open-loop run at ``--rate-fraction`` of that peak
for latency. The no-op server runs first and again last (the control): the gap between the
two is the noise floor of the machine. Numbers are printed as a markdown table with ratios to
the Go reference and to the no-op of the same transport (grpcio or pyvoy); then the tail: an
open-loop run at ``--tail-fraction`` of the Go reference's peak for the pyvoy targets.

    python bench/run.py                  # go, noop, memory, redis fixed_window + gcra, 3d
    python bench/run.py --redis          # plus every Redis algorithm, and the flood
    python bench/run.py --duration 1 --targets noop,memory   # smoke check, < 1 min

See docs/benchmarks.md for what the columns mean and the last measured numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# bench/ for loadgen, the repository root for the tests' process helpers (tests/support).
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from loadgen import Result, Workload, h2load_available, run_h2load, run_python  # noqa: E402

from sluice.algorithms import ALGORITHMS
from tests.support.processes import (
    free_port,
    redis_server_args,
    sluice_serve,
    stop_process,
    wait_until,
)

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
# The largest limit there is (uint32): every call is admitted, whatever the load, so the
# cost measured is the admitted path (sluice serve gets --max-sliding-log-limit to match).
LIMIT = 4_294_967_295
# The flood key: low, so that nearly every call is over the limit and the local cache can act.
FLOOD_LIMIT = 10
FLOOD_VALUE = "everyone"
CLK_TCK = os.sysconf("SC_CLK_TCK")
SCRIPT_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
GO_BINARY = Path("/work/shared/anchors/envoyproxy-ratelimit/ratelimit")
GO_NAME = "go-redis-fixed_window"  # the reference every row's × Go is taken against
# The reference doing a 3-descriptor request's work (the `3d` group): the 3-descriptor rows'
# × Go is taken against it, so like is compared with like.
GO_3D_NAME = "go-redis-fixed_window-3d"
# The tail is measured for these (at --tail-fraction of the Go reference's peak). The Go
# reference's own tail at that rate is the machine's floor: the goal's 5 ms is read beside it.
TAIL_TARGETS = (GO_NAME, "memory-fixed_window-pyvoy", "redis-fixed_window-pyvoy")


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # "noop", "sluice" or "go" (envoyproxy/ratelimit)
    backend: str = "memory"
    algorithm: str = "fixed_window"
    local_cache: bool | None = None  # None: leave Sluice's default
    flood: bool = False  # every call names the same key, over its limit
    transport: str = "grpcio"  # "grpcio" or "pyvoy" (noop and sluice); "go" for the reference
    descriptors: int | None = None  # per request; None: --descriptors
    redis_client: str | None = None  # sluice serve --redis-client; None: Sluice's default

    @property
    def expected_limit(self) -> int:
        return FLOOD_LIMIT if self.flood else LIMIT


@dataclass
class Row:
    target: Target
    peak: Result | None = None
    latency: Result | None = None
    tail: Result | None = None  # open loop at --tail-fraction of the Go reference's peak
    server_cpu_us: float = float("nan")
    server_busy: float = float("nan")  # share of the server's core used at peak
    server_errors: int = 0  # calls the server answered with a gRPC error (Sluice's metrics)
    decided: int | None = None  # calls Sluice decided (OK/OVER_LIMIT) during the peak
    redis_cpu_us: float | None = None  # redis-server CPU per call during the peak
    redis_commands: float | None = None  # per call, commands run inside scripts included
    redis_scripts: float | None = None  # per call: EVAL/EVALSHA/FCALL
    redis_reads: float | None = None  # per call: socket reads, a round-trip proxy
    skipped: str = ""
    notes: list[str] = field(default_factory=list)


# --- processes -------------------------------------------------------------------------------


def pinned(cpu: int | None, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(cpu), *command] if cpu is not None else command


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (gRPC's own threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def child_pid(pid: int, name: str, timeout_s: float = 10) -> int:
    """The child process of ``pid`` called ``name`` (Envoy under a pyvoy launcher)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{child}/comm").read_text().strip() == name:
                        return int(child)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {name} child under pid {pid}")
        time.sleep(0.1)


def policy_yaml(algorithm: str) -> str:
    def rule(key: str, limit: int) -> str:
        return (
            f"  - key: {key}\n"
            f"    rate_limit: {{unit: second, requests_per_unit: {limit}, "
            f"algorithm: {algorithm}}}\n"
        )

    return "domain: bench\ndescriptors:\n" + rule("user", LIMIT) + rule("flood", FLOOD_LIMIT)


def sluice_supports(flag: str) -> bool:
    help_text = subprocess.run(
        [str(VENV_BIN / "sluice"), "serve", "--help"], capture_output=True, text=True
    ).stdout
    return flag in help_text


class Redis:
    """A private redis-server on a free port, for the duration of the run."""

    def __init__(self, workdir: Path, cpu: int | None) -> None:
        import redis

        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        command = ["redis-server", *redis_server_args(workdir, self.port)]
        self.proc = subprocess.Popen(pinned(cpu, command), stdout=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port)

        def answers() -> bool:
            try:
                return bool(self.client.ping())
            except redis.ConnectionError:
                return False

        wait_until(answers, 5, "redis-server")

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)  # taskset execs: this is redis-server

    def stats(self) -> tuple[int, int, int]:
        """(commands, script calls, socket reads) so far; the harness's INFO not counted."""
        commands = scripts = 0
        for name, stat in self.client.info("commandstats").items():
            command = name.removeprefix("cmdstat_")
            if command == "info":
                continue
            commands += int(stat["calls"])
            if command in SCRIPT_COMMANDS:
                scripts += int(stat["calls"])
        return commands, scripts, int(self.client.info("stats")["total_reads_processed"])

    def close(self) -> None:
        self.client.close()
        stop_process(self.proc, 15)


@dataclass
class Server:
    proc: subprocess.Popen[Any]
    grpc_port: int
    http_port: int | None
    log: Path
    cpu_pid: int = 0  # the process whose CPU is the server's (Envoy for pyvoy); 0: proc

    @property
    def pid(self) -> int:
        return self.cpu_pid or self.proc.pid

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def metrics(self) -> str:
        """Sluice's /metrics, as text."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def grpc_errors(self, metrics: str | None = None) -> int:
        """Calls Sluice answered with a gRPC error so far (h2load cannot see those), from
        ``metrics`` when the caller already fetched them."""
        return self.grpc_counts(metrics)[1]

    def grpc_counts(self, metrics: str | None = None) -> tuple[int, int]:
        """(calls decided: OK or OVER_LIMIT, calls answered with an error) so far, from
        ``sluice_request_duration_seconds_count``; (0, 0) for a server without metrics."""
        if self.http_port is None:
            return 0, 0
        text = self.metrics() if metrics is None else metrics
        decided = errors = 0
        for line in text.splitlines():
            if (
                line.startswith("sluice_request_duration_seconds_count{")
                and 'transport="grpc"' in line
            ):
                count = int(float(line.rsplit(" ", 1)[1]))
                if re.search(r'code="(OK|OVER_LIMIT)"', line):
                    decided += count
                else:
                    errors += count
        return decided, errors


@contextlib.contextmanager
def serving(
    target: Target, workdir: Path, cpu: int | None, redis: Redis | None
) -> Iterator[Server]:
    """The target's server, pinned to ``cpu``, answering with the benchmark's rule; stopped
    (SIGTERM) at the end."""
    if target.kind == "go":
        with serving_go(target, workdir, cpu, redis) as server:
            yield server
        return
    if target.kind == "noop":
        grpc_port = free_port()
        log = workdir / f"{target.name}.log"
        command = [sys.executable, str(HERE / "noop_server.py"), "--port", str(grpc_port)]
        command += ["--transport", target.transport]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                pinned(cpu, command), stdout=out, stderr=subprocess.STDOUT, cwd=workdir
            )
        try:
            server = Server(proc, grpc_port, None, log)
            probe(server, target)
            if target.transport == "pyvoy":
                server.cpu_pid = child_pid(proc.pid, "envoy")
            yield server
        finally:
            stop_process(proc, 15)
        return
    policy = workdir / f"policy-{target.algorithm}.yaml"
    policy.write_text(policy_yaml(target.algorithm))
    extra_args = ["--snapshot-cache", "", "--shutdown-grace-s", "1", "--log-level", "WARNING"]
    extra_args += ["--max-sliding-log-limit", str(LIMIT)]
    extra_args += ["--transport", target.transport]
    if target.backend == "redis":
        assert redis is not None
        extra_args += ["--backend", "redis", "--redis-url", redis.url]
    if target.redis_client is not None:
        extra_args += ["--redis-client", target.redis_client]
    if target.local_cache is not None:
        extra_args.append("--local-cache" if target.local_cache else "--no-local-cache")
    with sluice_serve(
        workdir,
        config=policy,
        database_url=f"sqlite:///{workdir / (target.name + '.db')}",
        extra_args=extra_args,
        command_prefix=pinned(cpu, []),
    ) as sluice:
        server = Server(sluice.process, sluice.grpc_port, sluice.http_port, sluice.log_path)
        probe(server, target)
        if target.transport == "pyvoy":
            server.cpu_pid = child_pid(sluice.process.pid, "envoy")
        yield server


@contextlib.contextmanager
def serving_go(
    target: Target, workdir: Path, cpu: int | None, redis: Redis | None
) -> Iterator[Server]:
    """envoyproxy/ratelimit on its own (fresh) ``redis``, the same domain and rule as
    Sluice's; pinned to ``cpu`` it runs with GOMAXPROCS=1."""
    assert redis is not None
    config = workdir / "go-runtime" / "ratelimit" / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "bench.yaml").write_text(
        "domain: bench\ndescriptors:\n"
        f"  - key: user\n    rate_limit: {{unit: second, requests_per_unit: {LIMIT}}}\n"
    )
    grpc_port, http_port, debug_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "USE_STATSD": "false",
        "LOG_LEVEL": "warn",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"127.0.0.1:{redis.port}",
        "RUNTIME_ROOT": str(workdir / "go-runtime"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_APPDIRECTORY": "config",
        "RUNTIME_WATCH_ROOT": "false",
        "HOST": "127.0.0.1",
        "GRPC_HOST": "127.0.0.1",
        "DEBUG_HOST": "127.0.0.1",
        "GRPC_PORT": str(grpc_port),
        "PORT": str(http_port),
        "DEBUG_PORT": str(debug_port),
    }
    log = workdir / f"{target.name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            pinned(cpu, [str(GO_BINARY)]), stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        server = Server(proc, grpc_port, None, log)
        probe(server, target)
        yield server
    finally:
        stop_process(proc, 15)


def probe(server: Server, target: Target) -> None:
    """Wait until the server answers, and check Sluice applies the benchmark's rule: a
    benchmark of a request no rule matches would measure the wrong path."""
    import grpc

    from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2

    body = workload_for(target, keyspace=1, descriptors=1).requests(1)[0]
    deadline = time.monotonic() + 30
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_unary(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            request_serializer=None,
            response_deserializer=rls_pb2.RateLimitResponse.FromString,
        )
        while True:
            if server.proc.poll() is not None:
                raise RuntimeError(f"{target.name} exited: {server.log.read_text()[-2000:]}")
            try:
                response = call(body, timeout=1)
                break
            except grpc.RpcError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{target.name} did not answer: {exc}") from exc
                time.sleep(0.1)
    if target.kind in ("sluice", "go"):
        status = response.statuses[0] if response.statuses else None
        got = status.current_limit.requests_per_unit if status else None
        if got != target.expected_limit:
            raise RuntimeError(f"{target.name}: the benchmark rule does not apply: {response}")


# --- measuring -------------------------------------------------------------------------------


def workload_for(target: Target, keyspace: int, descriptors: int) -> Workload:
    if target.flood:
        return Workload(key="flood", keyspace=1, descriptors=1, fixed_value=FLOOD_VALUE)
    if target.descriptors is not None:
        descriptors = target.descriptors
    return Workload(key="user", keyspace=keyspace, descriptors=descriptors)


def drive(
    args: argparse.Namespace,
    server: Server,
    workload: Workload,
    mode: str,
    duration: float,
    rate: float = 0.0,
) -> Result:
    cpus = (args.load_cpu,) if args.load_cpu is not None else None
    if args.driver == "h2load":
        return run_h2load(
            server.target,
            workload,
            mode=mode,
            duration_s=duration,
            connections=args.connections,
            streams=args.streams,
            rate=rate,
            cpus=cpus,
        )
    return run_python(
        server.target,
        workload,
        mode=mode,
        duration_s=duration,
        processes=args.processes,
        channels=args.channels,
        concurrency=args.concurrency,
        rate=rate,
        cpus=cpus,
    )


def measure(
    args: argparse.Namespace,
    target: Target,
    workdir: Path,
    redis: Redis | None,
    go_rps: float | None = None,
) -> Row:
    if target.kind == "go":
        # Its own redis-server, fresh: nothing of Sluice's keys, nothing of Sluice's load.
        own = Redis(workdir, args.load_cpu)
        try:
            return _measure(args, target, workdir, own, go_rps)
        finally:
            own.close()
    if redis is not None:
        redis.client.flushall()
    return _measure(args, target, workdir, redis, go_rps)


def _measure(
    args: argparse.Namespace,
    target: Target,
    workdir: Path,
    redis: Redis | None,
    go_rps: float | None,
) -> Row:
    row = Row(target)
    with serving(target, workdir, args.server_cpu, redis) as server:
        workload = workload_for(target, args.keyspace, args.descriptors)
        if args.warmup > 0:
            drive(args, server, workload, "peak", args.warmup)
        if target.backend != "redis":
            redis = None  # a Redis kept for other targets: nothing of this one's to count
        decided0, errors0 = server.grpc_counts()
        redis0 = redis.stats() if redis is not None else None
        redis_cpu0 = redis.cpu_seconds() if redis is not None else 0.0
        cpu0 = cpu_seconds(server.pid)
        row.peak = drive(args, server, workload, "peak", args.duration)
        cpu1 = cpu_seconds(server.pid)
        redis_cpu1 = redis.cpu_seconds() if redis is not None else 0.0
        decided1, errors1 = server.grpc_counts()
        calls = max(1, row.peak.calls)
        row.server_cpu_us = (cpu1 - cpu0) / calls * 1e6
        row.server_busy = (cpu1 - cpu0) / row.peak.duration_s
        row.server_errors = errors1 - errors0
        if target.kind == "sluice":
            row.decided = decided1 - decided0
            # Answered 200 by h2load but neither decided nor counted as an error by Sluice
            # (refused before the handler): errors too. Calls Sluice decided after h2load
            # stopped waiting can make decided exceed calls; never the other way round.
            succeeded = row.peak.calls - row.peak.errors
            row.server_errors += max(0, succeeded - row.decided - row.server_errors)
        if redis is not None and redis0 is not None:
            commands, scripts, reads = (b - a for a, b in zip(redis0, redis.stats(), strict=True))
            row.redis_commands = commands / calls
            row.redis_scripts = scripts / calls
            row.redis_reads = max(0, reads - 2) / calls  # 2: the harness's own INFO calls
            row.redis_cpu_us = (redis_cpu1 - redis_cpu0) / calls * 1e6
        if not target.flood and row.peak.rps > 0 and args.rate_fraction > 0:
            errors0 = server.grpc_errors()
            row.latency = drive(
                args,
                server,
                workload,
                "rate",
                args.duration,
                rate=args.rate_fraction * row.peak.rps,
            )
            row.server_errors += server.grpc_errors() - errors0
        if target.name == GO_NAME:
            go_rps = row.peak.rps
        if target.name in TAIL_TARGETS and go_rps and args.tail_duration > 0:
            errors0 = server.grpc_errors()
            row.tail = drive(
                args, server, workload, "rate", args.tail_duration, rate=args.tail_fraction * go_rps
            )
            row.server_errors += server.grpc_errors() - errors0
    if server.proc.returncode not in (0, -signal.SIGTERM):
        row.notes.append(f"exit code {server.proc.returncode}, log {server.log}")
    return row


# --- reporting -------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or value != value:  # None or nan
        return "–"
    return f"{value:,.{digits}f}"


def row_errors(row: Row) -> int:
    """Failed calls in every phase: h2load's (transport) and Sluice's gRPC errors."""
    return (
        (row.peak.errors if row.peak else 0)
        + (row.latency.errors if row.latency else 0)
        + (row.tail.errors if row.tail else 0)
        + row.server_errors
    )


def noop_for(row: Row, rows: list[Row]) -> Row | None:
    """The no-op of ``row``'s transport, first measured (not the control)."""
    for other in rows:
        if other.target.kind == "noop" and other.target.transport == row.target.transport:
            return other if other.peak else None
    return None


def descriptors_of(target: Target) -> int:
    return target.descriptors if target.descriptors is not None else args_descriptors


def go_for(row: Row, rows: list[Row]) -> Row | None:
    """The Go reference ``row`` is compared with: the one sending as many descriptors per
    request when it was measured, else the one-descriptor reference."""
    want = descriptors_of(row.target)
    measured = [r for r in rows if r.target.kind == "go" and r.peak]
    same = [r for r in measured if descriptors_of(r.target) == want]
    return (same or [r for r in measured if r.target.name == GO_NAME] or [None])[0]


def table(rows: list[Row], baseline: Row) -> str:
    header = (
        "| target | peak req/s | × Go req/s | × noop req/s | server CPU µs/call | × Go CPU "
        "| × noop CPU | server core busy | Redis CPU µs/call | × Go Redis CPU "
        "| rate for latency | p50 ms | p99 ms | p99.9 ms | errors (h2load / gRPC) "
        "| Redis cmds/call | Redis scripts/call | Redis reads/call | client CPU µs/call |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        go = go_for(row, rows)
        if row.skipped:
            lines.append(f"| {row.target.name} | skipped: {row.skipped} |" + " |" * 17)
            continue
        assert row.peak is not None
        lat = row.latency
        noop = noop_for(row, rows) if row.target.kind != "go" else None
        noop_rps = noop.peak.rps if noop and noop.peak else float("nan")
        noop_cpu = noop.server_cpu_us if noop else float("nan")
        go_rps = go.peak.rps if go and go.peak else float("nan")
        go_cpu = go.server_cpu_us if go else float("nan")
        go_redis = go.redis_cpu_us if go and go.redis_cpu_us else float("nan")
        transport_errors = row_errors(row) - row.server_errors
        name = row.target.name
        if row_errors(row):
            name += " **(errors)**"
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    fmt(row.peak.rps),
                    fmt(row.peak.rps / go_rps, 2),
                    fmt(row.peak.rps / noop_rps, 2),
                    fmt(row.server_cpu_us),
                    fmt(row.server_cpu_us / go_cpu, 2),
                    fmt(row.server_cpu_us / noop_cpu, 2),
                    f"{row.server_busy:.0%}",
                    fmt(row.redis_cpu_us, 1),
                    fmt(row.redis_cpu_us / go_redis if row.redis_cpu_us else None, 2),
                    fmt(lat.rps) if lat else "–",
                    fmt(lat.p50_ms, 2) if lat else "–",
                    fmt(lat.p99_ms, 2) if lat else "–",
                    fmt(lat.p999_ms, 2) if lat else "–",
                    f"{transport_errors} / "
                    + (str(row.server_errors) if row.target.kind == "sluice" else "–"),
                    fmt(row.redis_commands, 2),
                    fmt(row.redis_scripts, 2),
                    fmt(row.redis_reads, 2),
                    fmt(row.peak.client_cpu_us_per_call),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def tail_table(rows: list[Row]) -> str:
    header = (
        "| target | offered req/s | done req/s | p50 ms | p99 ms | p99.9 ms | max ms "
        "| calls > 20 ms | errors |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        if (tail := row.tail) is None:
            continue
        lines.append(
            f"| {row.target.name} | {fmt(tail.offered_rps)} | {fmt(tail.rps)} "
            f"| {fmt(tail.p50_ms, 2)} | {fmt(tail.p99_ms, 2)} | {fmt(tail.p999_ms, 2)} "
            f"| {fmt(tail.max_ms, 2)} | {tail.over_20ms} | {tail.errors} |"
        )
    return "\n".join(lines)


def verdicts(rows: list[Row], baseline: Row) -> list[str]:
    """The issue's targets, each PASS/MISS with the number it was judged on."""
    by_name = {r.target.name: r for r in rows if not r.skipped and r.peak}
    out = []
    control = by_name.get("noop-control")
    if control and control.peak and baseline.peak:
        drift = control.peak.rps / baseline.peak.rps - 1
        if abs(drift) > 0.10:
            out.append(
                f"- WARNING: the no-op control is {drift:+.0%} off the baseline: this run is "
                "noise-dominated; rerun (longer --duration, quieter machine) before trusting it"
            )

    def ratio(name: str) -> float | None:
        row = by_name.get(name)
        return row.peak.rps / baseline.peak.rps if row and row.peak and baseline.peak else None

    def line(ok: bool, text: str) -> None:
        out.append(f"- {'PASS' if ok else 'MISS'}: {text}")

    out += go_verdicts(by_name)

    if (r := ratio("memory-fixed_window")) is not None:
        line(r >= 0.9, f"memory backend ≥ 0.9× no-op req/s: {r:.2f}×")
    if (r := ratio("redis-gcra")) is not None:
        line(r >= 0.8, f"Redis backend (GCRA, 1 descriptor) ≥ 0.8× no-op req/s: {r:.2f}×")
    # The no-op handler's own p99 at the same share of its peak, on the same transport: what
    # the stack allows here.
    for row in by_name.values():
        if row.target.kind == "sluice" and row.latency:
            noop = noop_for(row, rows)
            noop_p99 = noop.latency.p99_ms if noop and noop.latency else float("nan")
            line(
                row.latency.p99_ms <= 2.0,
                f"{row.target.name}: p99 ≤ 2 ms at {args_fraction:.0%} of peak: "
                f"{row.latency.p99_ms:.2f} ms (no-op handler: {noop_p99:.2f} ms)",
            )
    for row in by_name.values():
        if (
            row.target.kind == "sluice"
            and row.target.backend == "redis"
            and not row.target.flood
            and row.redis_reads is not None
        ):
            line(
                row.redis_reads <= 1.0 and (row.redis_scripts or 0) <= 1.0,
                f"{row.target.name}: ≤ 1 Redis round trip per call: {row.redis_reads:.2f} "
                f"reads/call, {row.redis_scripts:.2f} script calls/call",
            )
    on, off = by_name.get("flood-local-cache-on"), by_name.get("flood-local-cache-off")
    if on and off and on.redis_commands is not None and off.redis_commands:
        cut = 1 - on.redis_commands / off.redis_commands
        line(
            cut >= 0.9,
            f"local cache cuts Redis commands under a single-key flood by ≥ 90 %: "
            f"{cut:.1%} ({off.redis_commands:.2f} → {on.redis_commands:.2f} per call)",
        )
    return out


args_fraction = 0.5  # set from --rate-fraction, for the verdict wording
args_descriptors = 1  # set from --descriptors: what a target without its own count sends


def go_verdicts(by_name: dict[str, Row]) -> list[str]:
    """The data-plane issue's goals against the Go reference, judged on the pyvoy rows."""
    go1 = by_name.get(GO_NAME)
    if go1 is None or go1.peak is None or not go1.peak.rps:
        return []
    rows = list(by_name.values())
    out = []

    def line(ok: bool, text: str, row: Row) -> None:
        flag = " (the row has errors: not a valid measurement)" if row_errors(row) else ""
        out.append(f"- {'PASS' if ok else 'MISS'}: {text}{flag}")

    goals = []  # (row, least × Go req/s, what)
    for row in by_name.values():
        t = row.target
        if t.kind != "sluice" or t.transport != "pyvoy" or t.flood:
            continue
        several = (t.descriptors or 1) > 1
        if several:
            goals.append((row, 0.7, "three descriptors"))
        elif t.backend == "memory":
            goals.append((row, 1.0, "memory"))
        elif t.algorithm == "fixed_window":
            goals.append((row, 0.8, "Redis fixed window"))
        else:
            goals.append((row, 0.7, f"Redis {t.algorithm}"))
    for row, least, what in goals:
        go = go_for(row, rows) or go1
        assert row.peak is not None and go.peak is not None
        r = row.peak.rps / go.peak.rps
        line(
            r >= least,
            f"{row.target.name} ({what}) ≥ {least:.1f}× {go.target.name} req/s: {r:.2f}×",
            row,
        )
    for row in by_name.values():
        t = row.target
        if t.kind != "sluice" or t.transport != "pyvoy" or t.flood or not row.redis_cpu_us:
            continue
        go = go_for(row, rows) or go1
        if not go.redis_cpu_us:
            continue
        least = 1.0 if t.algorithm == "fixed_window" else 1.5
        r = row.redis_cpu_us / go.redis_cpu_us
        line(
            r <= least,
            f"{t.name}: Redis CPU per call ≤ {least:.1f}× {go.target.name}'s: "
            f"{row.redis_cpu_us:.1f} µs against {go.redis_cpu_us:.1f} ({r:.2f}×)",
            row,
        )
    for row in by_name.values():
        if (tail := row.tail) is not None and row.target.kind == "go":
            out.append(
                f"- REFERENCE: {row.target.name}'s own tail at {fmt(tail.offered_rps)} req/s: "
                f"p99.9 {tail.p999_ms:.2f} ms, {tail.over_20ms} calls over 20 ms "
                f"(max {tail.max_ms:.1f} ms): what this machine and load generator allow"
            )
        elif tail is not None:
            line(
                tail.p999_ms <= 5.0 and tail.over_20ms == 0,
                f"{row.target.name}: tail at {fmt(tail.offered_rps)} req/s (half Go's peak): "
                f"p99.9 {tail.p999_ms:.2f} ms ≤ 5 ms, {tail.over_20ms} calls over 20 ms "
                f"(max {tail.max_ms:.1f} ms)",
                row,
            )
    return out


# --- the run ---------------------------------------------------------------------------------


def plan(args: argparse.Namespace) -> tuple[list[Target], list[Row]]:
    """The targets to measure, and rows for those that cannot be (with the reason)."""
    names = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.redis and "redis" not in names:
        names.append("redis")
    transports = args.transports

    def suffix(transport: str) -> str:
        return "" if transport == "grpcio" else f"-{transport}"

    if shutil.which("redis-server") is None:
        no_redis = "redis-server not installed"
    elif not sluice_supports("--redis-url"):
        no_redis = "this sluice has no Redis backend yet (no --redis-url)"
    else:
        no_redis = ""
    targets: list[Target] = []
    skipped: list[Row] = []
    go_missing = "" if GO_BINARY.exists() else f"{GO_BINARY} not found"
    go_missing = go_missing or ("redis-server not installed" if "not installed" in no_redis else "")
    for name in names:
        if name == "go":
            go = Target(GO_NAME, "go", "redis", "fixed_window", transport="go")
            if go_missing:
                skipped.append(Row(go, skipped=go_missing))
            else:
                targets.append(go)
        elif name == "noop":
            targets += [Target(f"noop{suffix(t)}", "noop", transport=t) for t in transports]
        elif name == "memory":
            targets += [
                Target(f"memory-fixed_window{suffix(t)}", "sluice", "memory", "fixed_window", None,
                       transport=t)
                for t in transports
            ]  # fmt: skip
        elif name in ("redis", "3d"):
            if name == "redis":
                # --redis: every algorithm, and the flood; else the two the goals name first.
                algorithms = args.algorithms if args.redis else ["fixed_window", "gcra"]
                redis_targets = [
                    Target(f"redis-{a}{suffix(t)}", "sluice", "redis", a, transport=t)
                    for a in algorithms
                    for t in transports
                ]
                flood = [
                    Target(
                        f"flood-local-cache-{state}", "sluice", "redis", "gcra", cache, flood=True
                    )
                    for state, cache in (("off", False), ("on", True))
                ]
                if not args.redis:
                    flood = []
            else:
                # Three descriptors per request, on pyvoy (the transport the goals are for).
                if "pyvoy" not in transports:
                    continue
                # The Go reference doing the same work: 3 descriptors, 3 counters per call.
                go3 = Target(GO_3D_NAME, "go", "redis", "fixed_window", transport="go",
                             descriptors=3)  # fmt: skip
                if go_missing:
                    skipped.append(Row(go3, skipped=go_missing))
                else:
                    targets.append(go3)
                targets.append(
                    Target("memory-fixed_window-3d-pyvoy", "sluice", transport="pyvoy",
                           descriptors=3)
                )  # fmt: skip
                redis_targets = [
                    Target("redis-fixed_window-3d-pyvoy", "sluice", "redis", "fixed_window",
                           transport="pyvoy", descriptors=3)
                ]  # fmt: skip
                flood = []
            if args.redis_py_too:
                # The same Redis targets through redis-py's client, for a same-run comparison.
                redis_targets += [
                    dataclasses.replace(t, name=f"{t.name}-redispy", redis_client="redis-py")
                    for t in redis_targets
                    if t.transport == "pyvoy" and t.algorithm == "fixed_window"
                ]
            if no_redis:
                skipped += [Row(t, skipped=no_redis) for t in redis_targets + flood]
                continue
            targets += redis_targets
            if sluice_supports("--local-cache"):
                targets += flood
            else:
                skipped += [Row(t, skipped="no --local-cache flag yet") for t in flood]
        else:
            raise SystemExit(f"unknown target {name!r} (go, noop, memory, redis, 3d)")
    if any(t.transport == "pyvoy" for t in targets) and not sluice_supports("--transport"):
        skipped += [
            Row(t, skipped="no --transport flag yet") for t in targets if t.transport == "pyvoy"
        ]
        targets = [t for t in targets if t.transport != "pyvoy"]
    # The Go reference first: its peak sets the tail's rate. Then the no-ops (the first is
    # the baseline), the rest, and the first no-op again: the control, the noise of the run.
    go_first = [t for t in targets if t.kind == "go"]
    rest = [t for t in targets if t.kind != "go"]
    if not any(t.kind == "noop" for t in rest):
        rest.insert(0, Target("noop", "noop"))  # ratios need the baseline
    elif rest[0].kind != "noop":
        first = next(t for t in rest if t.kind == "noop")
        rest.remove(first)
        rest.insert(0, first)
    control = Target("noop-control", "noop", transport=rest[0].transport)
    return [*go_first, *rest, control], skipped


def main(argv: list[str] | None = None) -> int:
    global args_fraction, args_descriptors
    parser = argparse.ArgumentParser(
        description="Benchmark Sluice against the Go reference and a no-op handler."
    )
    parser.add_argument(
        "--targets",
        default="go,noop,memory,redis,3d",
        help="go, noop, memory, redis (fixed_window and gcra; every algorithm with --redis), "
        "3d (memory and Redis fixed window, 3 descriptors per request, pyvoy)",
    )
    parser.add_argument("--redis", action="store_true", help="every Redis algorithm, and the flood")
    parser.add_argument(
        "--redis-py-too",
        action="store_true",
        help="also the pyvoy Redis fixed_window targets with --redis-client redis-py (suffix "
        "-redispy): the lean client path against redis-py's in one run",
    )
    parser.add_argument(
        "--transports",
        default="grpcio,pyvoy",
        type=lambda s: [t for t in s.split(",") if t],
        help="the transports Sluice and the no-op are measured on",
    )
    parser.add_argument(
        "--algorithms", default=",".join(ALGORITHMS), type=lambda s: [a for a in s.split(",") if a]
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--warmup", type=float, default=None, help="[min(2, duration)]")
    parser.add_argument(
        "--driver",
        choices=("auto", "h2load", "python"),
        default="auto",
        help="auto: h2load when installed (far less client CPU per call)",
    )
    parser.add_argument(
        "--rate-fraction",
        type=float,
        default=0.5,
        help="latency is measured at this share of each target's peak",
    )
    parser.add_argument(
        "--tail-duration",
        type=float,
        default=10.0,
        help="seconds of the tail run (0: none); the issue's target is 60",
    )
    parser.add_argument(
        "--tail-fraction",
        type=float,
        default=0.5,
        help="the tail run's rate, as a share of the Go reference's peak",
    )
    parser.add_argument("--keyspace", type=int, default=1000, help="distinct values (python)")
    parser.add_argument("--descriptors", type=int, default=1, help="per request")
    parser.add_argument("--connections", type=int, default=8, help="h2load")
    parser.add_argument("--streams", type=int, default=8, help="h2load, per connection")
    parser.add_argument("--processes", type=int, default=2, help="python driver")
    parser.add_argument("--channels", type=int, default=2, help="python driver, per process")
    parser.add_argument("--concurrency", type=int, default=32, help="python driver, per process")
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--load-cpu", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--workdir", type=Path, help="keep server logs and databases here")
    args = parser.parse_args(argv)
    args_fraction = args.rate_fraction
    args_descriptors = args.descriptors
    if args.warmup is None:
        args.warmup = min(2.0, args.duration)
    if args.driver == "auto":
        args.driver = "h2load" if h2load_available() else "python"
    if shutil.which("taskset") is None:
        print("taskset not found: server and load are not pinned", file=sys.stderr)
        args.server_cpu = args.load_cpu = None

    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    targets, rows = plan(args)
    for row in rows:
        print(f"skipping {row.target.name}: {row.skipped}", file=sys.stderr)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        shared = any(t.backend == "redis" and t.kind == "sluice" for t in targets)
        redis = Redis(workdir, args.load_cpu) if shared else None
        go_rps: float | None = None
        try:
            for target in targets:
                print(f"measuring {target.name} ...", file=sys.stderr, flush=True)
                row = measure(args, target, workdir, redis, go_rps)
                if target.name == GO_NAME and row.peak:
                    go_rps = row.peak.rps
                rows.append(row)
        finally:
            if redis is not None:
                redis.close()
    order = {t.name: i for i, t in enumerate(targets)}
    rows.sort(key=lambda r: order.get(r.target.name, len(order)))
    baseline = next((r for r in rows if r.target.kind == "noop" and r.peak), None)
    assert baseline is not None and baseline.peak is not None

    keys = "1 key (h2load sends one body)" if args.driver == "h2load" else f"{args.keyspace} keys"
    print(
        "## Sluice vs envoyproxy/ratelimit and a no-op ShouldRateLimit handler "
        f"({time.strftime('%Y-%m-%d %H:%M')})\n"
    )
    command = ["python", "bench/run.py", *(argv if argv is not None else sys.argv[1:])]
    print(f"- command: `{shlex.join(command)}`")
    why = {
        "h2load": "h2load (chosen: it costs far less client CPU per call than the Python driver, "
        "so the server, not the load, is the bottleneck; see the last column)",
        "python": "python (grpc.aio, multiprocessing); it costs about as much CPU per call as "
        "the server: check 'server core busy' is near 100 %",
    }[args.driver]
    print(f"- driver: {why}")
    print(
        f"- load on core {args.load_cpu}, server on core {args.server_cpu} (taskset); "
        f"{os.cpu_count()} cores"
    )
    print(
        f"- requests: {args.descriptors} descriptor(s) each, {keys}; "
        f"{args.duration:g} s per phase after {args.warmup:g} s warm-up; "
        f"latency at {args.rate_fraction:.0%} of each target's own peak"
    )
    print(f"- load average before the run: {load_before}")
    print(f"- total time: {time.monotonic() - started:.0f} s\n")
    print(table(rows, baseline))
    print()
    if any(r.tail for r in rows):
        go = next((r for r in rows if r.target.name == GO_NAME and r.peak), None)
        go_peak = fmt(go.peak.rps) if go and go.peak else "–"
        print(
            f"Tail: open loop at {args.tail_fraction:.0%} of the Go reference's peak "
            f"({go_peak} req/s) for {args.tail_duration:g} s (h2load --rps per connection, "
            f"{args.connections} connections × {args.streams} streams):\n"
        )
        print(tail_table(rows))
        print()
    for line in verdicts(rows, baseline):
        print(line)
    # h2load counts a gRPC error (HTTP 200, grpc-status trailer) as a success: Sluice's own
    # count of decided calls is the proof that the calls measured were decisions.
    for row in rows:
        if row.target.kind == "sluice" and row.peak and row.decided is not None:
            print(
                f"- checked on /metrics, {row.target.name}: {row.decided:,} calls decided "
                f"(OK/OVER_LIMIT) during the peak, h2load completed {row.peak.calls:,}; "
                f"gRPC errors in every phase: {row.server_errors}"
            )
    for row in rows:
        for note in row.notes:
            print(f"- note, {row.target.name}: {note}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
