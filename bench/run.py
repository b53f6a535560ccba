"""One benchmark run: Sluice against a no-op ShouldRateLimit handler, measured in the same run.

Each target is started pinned to one core (``--server-cpu``), the load runs on another
(``--load-cpu``). Per target: a warm-up, a closed-loop peak (requests/s, server CPU per call,
Redis commands per call), then an open-loop run at ``--rate-fraction`` of that peak for
latency. The no-op server runs first and again last (the control): the gap between the two
is the noise floor of the machine. Numbers are printed as a markdown table with ratios to the
first no-op run.

    python bench/run.py                              # noop, memory (fixed_window), noop again
    python bench/run.py --redis                      # plus the Redis backend, every algorithm
    python bench/run.py --duration 1 --targets noop,memory   # smoke check, < 30 s

See docs/benchmarks.md for what the columns mean and the last measured numbers.
"""

from __future__ import annotations

import argparse
import contextlib
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
# High enough that the key-space load is never refused (the cost measured is the admitted
# path) and within the default --max-sliding-log-limit.
LIMIT = 10_000
# The flood key: low, so that nearly every call is over the limit and the local cache can act.
FLOOD_LIMIT = 10
FLOOD_VALUE = "everyone"
CLK_TCK = os.sysconf("SC_CLK_TCK")
SCRIPT_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # "noop" or "sluice"
    backend: str = "memory"
    algorithm: str = "fixed_window"
    local_cache: bool | None = None  # None: leave Sluice's default
    flood: bool = False  # every call names the same key, over its limit

    @property
    def expected_limit(self) -> int:
        return FLOOD_LIMIT if self.flood else LIMIT


@dataclass
class Row:
    target: Target
    peak: Result | None = None
    latency: Result | None = None
    server_cpu_us: float = float("nan")
    server_busy: float = float("nan")  # share of the server's core used at peak
    server_errors: int = 0  # calls the server answered with a gRPC error (Sluice's metrics)
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
        if self.http_port is None:
            return 0
        text = self.metrics() if metrics is None else metrics
        total = 0
        for line in text.splitlines():
            if (
                line.startswith("sluice_request_duration_seconds_count{")
                and 'transport="grpc"' in line
            ):
                if re.search(r'code="(error|invalid)"', line):
                    total += int(float(line.rsplit(" ", 1)[1]))
        return total


@contextlib.contextmanager
def serving(
    target: Target, workdir: Path, cpu: int | None, redis: Redis | None
) -> Iterator[Server]:
    """The target's server, pinned to ``cpu``, answering with the benchmark's rule; stopped
    (SIGTERM) at the end."""
    if target.kind == "noop":
        grpc_port = free_port()
        log = workdir / f"{target.name}.log"
        command = [sys.executable, str(HERE / "noop_server.py"), "--port", str(grpc_port)]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                pinned(cpu, command), stdout=out, stderr=subprocess.STDOUT, cwd=workdir
            )
        try:
            server = Server(proc, grpc_port, None, log)
            probe(server, target)
            yield server
        finally:
            stop_process(proc, 15)
        return
    policy = workdir / f"policy-{target.algorithm}.yaml"
    policy.write_text(policy_yaml(target.algorithm))
    extra_args = ["--snapshot-cache", "", "--shutdown-grace-s", "1", "--log-level", "WARNING"]
    if target.backend == "redis":
        assert redis is not None
        extra_args += ["--backend", "redis", "--redis-url", redis.url]
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
        yield server


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
    if target.kind == "sluice":
        status = response.statuses[0] if response.statuses else None
        got = status.current_limit.requests_per_unit if status else None
        if got != target.expected_limit:
            raise RuntimeError(f"{target.name}: the benchmark rule does not apply: {response}")


# --- measuring -------------------------------------------------------------------------------


def workload_for(target: Target, keyspace: int, descriptors: int) -> Workload:
    if target.flood:
        return Workload(key="flood", keyspace=1, descriptors=1, fixed_value=FLOOD_VALUE)
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


def measure(args: argparse.Namespace, target: Target, workdir: Path, redis: Redis | None) -> Row:
    row = Row(target)
    if redis is not None:
        redis.client.flushall()
    with serving(target, workdir, args.server_cpu, redis) as server:
        workload = workload_for(target, args.keyspace, args.descriptors)
        if args.warmup > 0:
            drive(args, server, workload, "peak", args.warmup)
        cpu0, errors0 = cpu_seconds(server.proc.pid), server.grpc_errors()
        if target.backend != "redis":
            redis = None  # a Redis kept for other targets: nothing of this one's to count
        redis0 = redis.stats() if redis is not None else None
        row.peak = drive(args, server, workload, "peak", args.duration)
        cpu1, errors1 = cpu_seconds(server.proc.pid), server.grpc_errors()
        calls = max(1, row.peak.calls)
        row.server_cpu_us = (cpu1 - cpu0) / calls * 1e6
        row.server_busy = (cpu1 - cpu0) / row.peak.duration_s
        row.server_errors = errors1 - errors0
        if redis is not None and redis0 is not None:
            commands, scripts, reads = (b - a for a, b in zip(redis0, redis.stats(), strict=True))
            row.redis_commands = commands / calls
            row.redis_scripts = scripts / calls
            row.redis_reads = max(0, reads - 2) / calls  # 2: the harness's own INFO calls
        if not target.flood and row.peak.rps > 0:
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
    if server.proc.returncode not in (0, -signal.SIGTERM):
        row.notes.append(f"exit code {server.proc.returncode}, log {server.log}")
    return row


# --- reporting -------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or value != value:  # None or nan
        return "–"
    return f"{value:,.{digits}f}"


def table(rows: list[Row], baseline: Row) -> str:
    header = (
        "| target | peak req/s | × noop req/s | server CPU µs/call | × noop CPU | server core busy "
        "| rate for latency | p50 ms | p99 ms | p99.9 ms | errors | Redis cmds/call "
        "| Redis scripts/call | Redis reads/call | client CPU µs/call |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    base_rps = baseline.peak.rps if baseline.peak else float("nan")
    for row in rows:
        if row.skipped:
            lines.append(f"| {row.target.name} | skipped: {row.skipped} |" + " |" * 13)
            continue
        assert row.peak is not None
        lat = row.latency
        errors = row.peak.errors + row.server_errors + (lat.errors if lat else 0)
        lines.append(
            "| "
            + " | ".join(
                [
                    row.target.name,
                    fmt(row.peak.rps),
                    fmt(row.peak.rps / base_rps, 2),
                    fmt(row.server_cpu_us),
                    fmt(row.server_cpu_us / baseline.server_cpu_us, 2),
                    f"{row.server_busy:.0%}",
                    fmt(lat.rps) if lat else "–",
                    fmt(lat.p50_ms, 2) if lat else "–",
                    fmt(lat.p99_ms, 2) if lat else "–",
                    fmt(lat.p999_ms, 2) if lat else "–",
                    str(errors),
                    fmt(row.redis_commands, 2),
                    fmt(row.redis_scripts, 2),
                    fmt(row.redis_reads, 2),
                    fmt(row.peak.client_cpu_us_per_call),
                ]
            )
            + " |"
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

    if (r := ratio("memory-fixed_window")) is not None:
        line(r >= 0.9, f"memory backend ≥ 0.9× no-op req/s: {r:.2f}×")
    if (r := ratio("redis-gcra")) is not None:
        line(r >= 0.8, f"Redis backend (GCRA, 1 descriptor) ≥ 0.8× no-op req/s: {r:.2f}×")
    # The no-op handler's own p99 at the same share of its peak: what the stack allows here.
    noop_p99 = baseline.latency.p99_ms if baseline.latency else float("nan")
    for row in by_name.values():
        if row.target.kind == "sluice" and row.latency:
            line(
                row.latency.p99_ms <= 2.0,
                f"{row.target.name}: p99 ≤ 2 ms at {args_fraction:.0%} of peak: "
                f"{row.latency.p99_ms:.2f} ms (no-op handler: {noop_p99:.2f} ms)",
            )
    for row in by_name.values():
        if row.target.backend == "redis" and not row.target.flood and row.redis_reads is not None:
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


# --- the run ---------------------------------------------------------------------------------


def plan(args: argparse.Namespace) -> tuple[list[Target], list[Row]]:
    """The targets to measure, and rows for those that cannot be (with the reason)."""
    names = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.redis and "redis" not in names:
        names.append("redis")
    targets: list[Target] = []
    skipped: list[Row] = []
    for name in names:
        if name == "noop":
            targets.append(Target("noop", "noop"))
        elif name == "memory":
            targets.append(Target("memory-fixed_window", "sluice", "memory", "fixed_window"))
        elif name == "redis":
            redis_targets = [Target(f"redis-{a}", "sluice", "redis", a) for a in args.algorithms]
            flood = [
                Target(f"flood-local-cache-{state}", "sluice", "redis", "gcra", cache, flood=True)
                for state, cache in (("off", False), ("on", True))
            ]
            if shutil.which("redis-server") is None:
                reason = "redis-server not installed"
            elif not sluice_supports("--redis-url"):
                reason = "this sluice has no Redis backend yet (no --redis-url)"
            else:
                reason = ""
            if reason:
                skipped += [Row(t, skipped=reason) for t in redis_targets + flood]
                continue
            targets += redis_targets
            if sluice_supports("--local-cache"):
                targets += flood
            else:
                skipped += [Row(t, skipped="no --local-cache flag yet") for t in flood]
        else:
            raise SystemExit(f"unknown target {name!r} (noop, memory, redis)")
    if targets and targets[0].kind == "noop":
        targets.append(Target("noop-control", "noop"))  # same server again: the noise
    elif not any(t.kind == "noop" for t in targets):
        targets.insert(0, Target("noop", "noop"))  # ratios need the baseline
        targets.append(Target("noop-control", "noop"))
    return targets, skipped


def main(argv: list[str] | None = None) -> int:
    global args_fraction
    parser = argparse.ArgumentParser(description="Benchmark Sluice against a no-op handler.")
    parser.add_argument("--targets", default="noop,memory", help="noop, memory, redis")
    parser.add_argument("--redis", action="store_true", help="add the Redis targets")
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
    if args.warmup is None:
        args.warmup = min(2.0, args.duration)
    if args.driver == "auto":
        args.driver = "h2load" if h2load_available() else "python"
    if shutil.which("taskset") is None:
        print("taskset not found: server and load are not pinned", file=sys.stderr)
        args.server_cpu = args.load_cpu = None

    targets, rows = plan(args)
    for row in rows:
        print(f"skipping {row.target.name}: {row.skipped}", file=sys.stderr)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        redis = (
            Redis(workdir, args.load_cpu) if any(t.backend == "redis" for t in targets) else None
        )
        try:
            for target in targets:
                print(f"measuring {target.name} ...", file=sys.stderr, flush=True)
                rows.append(measure(args, target, workdir, redis))
        finally:
            if redis is not None:
                redis.close()
    order = {t.name: i for i, t in enumerate(targets)}
    rows.sort(key=lambda r: order.get(r.target.name, len(order)))
    baseline = rows[0] if rows and rows[0].target.kind == "noop" else None
    assert baseline is not None and baseline.peak is not None

    keys = "1 key (h2load sends one body)" if args.driver == "h2load" else f"{args.keyspace} keys"
    print(f"## Sluice vs a no-op ShouldRateLimit handler ({time.strftime('%Y-%m-%d %H:%M')})\n")
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
    print(f"- total time: {time.monotonic() - started:.0f} s\n")
    print(table(rows, baseline))
    print()
    for line in verdicts(rows, baseline):
        print(line)
    for row in rows:
        for note in row.notes:
            print(f"- note, {row.target.name}: {note}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
