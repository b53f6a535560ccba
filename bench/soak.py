"""Soak: Sluice at a steady moderate rate for minutes, watching its memory and file descriptors.

Starts ``sluice serve`` (memory backend, or ``--redis`` against a private redis-server) on free
ports with a temporary SQLite config database and a policy using all six algorithms, then for
``--duration`` seconds:

- ShouldRateLimit over gRPC at ``--rate`` calls/s, open loop, with key churn: most calls name a
  value never seen before, some revisit a small pool, some hammer one hot value per rule
  (over its limit); one call in ten carries two descriptors;
- HTTP ``/json`` once a second, and ``/metrics`` at every sample;
- a policy change published through ``/api/v1`` every ``--publish-every`` seconds, so reloads
  (and the snapshot cache written with each) happen under load.

Every ``--interval`` seconds it samples the server's RSS, open fds, threads and CPU, the rate
achieved and the errors, prints the row, and at the end judges the second half: RSS slope by
linear fit and the fd range. Exit code 0 only when both are flat and nothing failed.

    python bench/soak.py                                  # 10 min, memory backend, 300/s
    python bench/soak.py --redis --out /tmp/soak.csv      # the Redis backend; samples as CSV
    python bench/soak.py --duration 60                    # check that the script works

Not part of the test run (it takes minutes); see docs/benchmarks.md for bench/ in general.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import itertools
import json
import os
import random
import re
import secrets
import signal
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

# bench/ for loadgen and run, the repository root for the tests' process helpers.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from loadgen import CALL_TIMEOUT_S, METHOD, percentile  # noqa: E402
from run import Redis, Server, cpu_seconds  # noqa: E402

from sluice.algorithms import ALGORITHMS
from tests.support.processes import sluice_serve

DOMAIN = "soak"
MIB = 1024 * 1024
OVER_LIMIT = 2  # RateLimitResponse.Code.OVER_LIMIT
JSON_EVERY_S = 1.0

# Key churn. Fresh values are never repeated, so counter state is created all the time and
# must be dropped when it expires; warm values come back every ~20 s at 300/s, so some state
# is renewed rather than recreated; the hot value of each rule is over its limit all the time.
HOT_SHARE, WARM_SHARE = 0.15, 0.25
WARM_VALUES = 200
TWO_DESCRIPTORS_SHARE = 0.1

# The verdict looks at the second half only: in the first, state fills up to its steady size
# (the longest-lived counter, a per-minute sliding_window_counter, lives two minutes; with
# --redis, the 65,536-entry cache of Redis key tags fills with fresh counters in about 5.5
# minutes at 300/s, so a longer --duration keeps that out of the judged half). RSS is flat
# when its slope is below both of:
# - one leaked object per call: the smallest thing Python can keep per call (an int held in
#   a list) takes 36 bytes, so 32 bytes per call is under any per-call leak;
# - one allocator step: pymalloc grows in 1 MiB arenas and glibc in mmap'd chunks of that
#   order, and one 1 MiB step in the middle of a fitted span of T minutes reads as a slope
#   of 1.5 MiB / T (least squares), without any leak.
LEAK_BYTES_PER_CALL = 32
ALLOCATOR_STEP_MIB = 1.0
# fds: sockets of this script's own HTTP requests and config-database connections opened by
# worker threads come and go; a leak only grows. Flat: the second half's range within this.
FD_SLACK = 4


def policy_yaml(generation: int) -> str:
    """The soak's policy: every algorithm, a nested rule with two limits, a wildcard, and an
    exact rule. Each generation differs a little (a publish of an identical document changes
    nothing), within a small range so that the traffic's share over limit stays comparable."""
    step = generation % 3
    return f"""\
domain: {DOMAIN}
descriptors:
  - key: fixed_window
    rate_limit: {{unit: second, requests_per_unit: {2 + step}}}
  - key: fixed_window
    value: vip-{generation}
    rate_limit: {{unit: second, requests_per_unit: 1000}}
  - key: sliding_window_log
    rate_limit: {{unit: minute, requests_per_unit: {20 + step}, algorithm: sliding_window_log}}
  - key: sliding_window_counter
    rate_limit:
      unit: minute
      requests_per_unit: {20 + step}
      algorithm: sliding_window_counter
  - key: token_bucket
    rate_limit: {{unit: second, requests_per_unit: 1, burst: {3 + step}, algorithm: token_bucket}}
  - key: leaky_bucket
    rate_limit: {{unit: minute, requests_per_unit: {30 + step}, burst: 5, algorithm: leaky_bucket}}
  - key: gcra
    rate_limit: {{unit: minute, requests_per_unit: {30 + step}, burst: 5, algorithm: gcra}}
  - key: tenant
    descriptors:
      - key: user
        rate_limit:
          limits:
            - {{unit: second, requests_per_unit: 5, burst: 5, algorithm: gcra}}
            - {{unit: minute, requests_per_unit: {100 + step}, algorithm: sliding_window_counter}}
  - key: path
    value: /items/*
    rate_limit: {{unit: second, requests_per_unit: 2, burst: 4, algorithm: token_bucket}}
"""


SHAPES = (*ALGORITHMS, "tenant", "path")


class Traffic:
    """Request descriptors with key churn (see HOT_SHARE above)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._fresh = itertools.count()

    def _value(self) -> str:
        r = self._rng.random()
        if r < HOT_SHARE:
            return "hot"
        if r < HOT_SHARE + WARM_SHARE:
            return f"w{self._rng.randrange(WARM_VALUES)}"
        return f"f{next(self._fresh)}"

    def _descriptor(self) -> list[tuple[str, str]]:
        shape, value = self._rng.choice(SHAPES), self._value()
        if shape == "tenant":
            tenant = "t0" if value == "hot" else f"t{self._rng.randrange(10)}"
            return [("tenant", tenant), ("user", value)]
        if shape == "path":
            return [("path", f"/items/{value}")]
        return [(shape, value)]

    def descriptors(self) -> list[list[tuple[str, str]]]:
        count = 2 if self._rng.random() < TWO_DESCRIPTORS_SHARE else 1
        return [self._descriptor() for _ in range(count)]

    def grpc_body(self) -> bytes:
        from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2

        message = rls_pb2.RateLimitRequest(domain=DOMAIN)
        for entries in self.descriptors():
            descriptor = message.descriptors.add()
            for key, value in entries:
                descriptor.entries.add(key=key, value=value)
        return message.SerializeToString()

    def json_body(self) -> bytes:
        descriptors = [
            {"entries": [{"key": k, "value": v} for k, v in entries]}
            for entries in self.descriptors()
        ]
        return json.dumps({"domain": DOMAIN, "descriptors": descriptors}).encode()


# --- what is measured ------------------------------------------------------------------------


@dataclass
class Counts:
    """Running totals of the load, shared by the tasks of one event loop."""

    calls: int = 0  # gRPC calls answered (OK or OVER_LIMIT)
    over_limit: int = 0
    grpc_errors: int = 0  # calls that failed, as the client saw them
    http_calls: int = 0
    http_errors: int = 0  # /json answers other than 200 and 429, or no answer
    publishes: int = 0
    publish_errors: int = 0
    latencies_s: list[float] = field(default_factory=list)  # since the last sample
    last_errors: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return self.grpc_errors + self.http_errors + self.publish_errors

    def failed(self, what: str) -> None:
        if len(self.last_errors) < 10:
            self.last_errors.append(what)


@dataclass
class Sample:
    t_s: float
    rss_mib: float
    fds: int
    threads: int
    cpu_pct: float  # server CPU over the interval, % of one core
    rate: float  # gRPC calls answered per second over the interval
    p99_ms: float
    over_limit_pct: float  # of the calls answered over the interval
    errors: int  # so far: gRPC, /json and publish failures
    server_errors: int  # so far: gRPC errors as Sluice counted them
    state_keys: int  # memory backend counters, or keys in Redis
    reloads: int  # snapshots installed so far, the initial one included


def proc_status(pid: int) -> tuple[float, int]:
    """(RSS in MiB, threads) of ``pid``."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def metric(text: str, name: str) -> float:
    """An unlabelled sample from Prometheus text (nan when absent)."""
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else float("nan")


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """(status, body) of one request; an HTTP error status is an answer, not an exception."""
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# --- the soak --------------------------------------------------------------------------------


class Soak:
    def __init__(
        self, args: argparse.Namespace, server: Server, redis: Redis | None, token: str
    ) -> None:
        self.args = args
        self.server = server
        self.redis = redis
        self.base = f"http://127.0.0.1:{server.http_port}"
        self.api_headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.traffic = Traffic(seed=1)
        self.counts = Counts()
        self.samples: list[Sample] = []
        self._previous: tuple[float, float] | None = None  # (time, server CPU s) last sampled

    async def run(self) -> None:
        import grpc

        from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2

        async with grpc.aio.insecure_channel(self.server.target) as channel:
            await asyncio.wait_for(channel.channel_ready(), 30)
            call = channel.unary_unary(
                METHOD,
                request_serializer=None,
                response_deserializer=rls_pb2.RateLimitResponse.FromString,
            )
            start = time.monotonic()
            end = start + self.args.duration
            workers = [
                asyncio.create_task(self._grpc_load(call, start, end)),
                asyncio.create_task(self._http_load(end)),
                asyncio.create_task(self._publish(start, end)),
            ]
            for n in itertools.count():
                due = min(start + n * self.args.interval, end)
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if self.server.proc.poll() is not None:
                    for worker in workers:
                        worker.cancel()
                    raise RuntimeError(
                        f"sluice serve exited: {self.server.log.read_text()[-2000:]}"
                    )
                await self._sample(start)
                if due >= end:
                    break
            await asyncio.gather(*workers)

    async def _grpc_load(self, call: object, start: float, end: float) -> None:
        """Open loop: a call starts when it is due whatever the answers, so a server that
        stalls shows as latency and timeouts, not as a lower offered rate."""
        inflight: set[asyncio.Task[None]] = set()
        for n in itertools.count():
            due = start + n / self.args.rate
            if due >= end:
                break
            if (delay := due - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._one(call, self.traffic.grpc_body()))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
        if inflight:
            await asyncio.wait(inflight)

    async def _one(self, call: object, body: bytes) -> None:
        import grpc

        t0 = time.monotonic()
        try:
            response = await call(body, timeout=CALL_TIMEOUT_S)  # type: ignore[operator]
        except grpc.aio.AioRpcError as exc:
            self.counts.grpc_errors += 1
            self.counts.failed(f"gRPC {exc.code().name}: {exc.details()}")
            return
        self.counts.latencies_s.append(time.monotonic() - t0)
        self.counts.calls += 1
        if response.overall_code == OVER_LIMIT:
            self.counts.over_limit += 1

    async def _http_load(self, end: float) -> None:
        while time.monotonic() + JSON_EVERY_S < end:
            await asyncio.sleep(JSON_EVERY_S)
            body = self.traffic.json_body()
            try:
                status, answer = await asyncio.to_thread(
                    http, "POST", f"{self.base}/json", body, {"Content-Type": "application/json"}
                )
            except OSError as exc:
                status, answer = 0, str(exc).encode()
            self.counts.http_calls += 1
            if status not in (200, 429):
                self.counts.http_errors += 1
                self.counts.failed(f"/json {status}: {answer[:200]!r}")

    async def _publish(self, start: float, end: float) -> None:
        """A new policy generation every --publish-every seconds, based on the version live."""
        url = f"{self.base}/api/v1/domains/{DOMAIN}"
        _, answer = await asyncio.to_thread(http, "GET", url, None, self.api_headers)
        version = int(json.loads(answer)["version"])
        for generation in itertools.count(2):
            due = start + (generation - 1) * self.args.publish_every
            if due >= end:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            body = {
                "document": policy_yaml(generation),
                "base_version": version,
                "comment": f"soak generation {generation}",
                "author": "soak",
            }
            try:
                status, answer = await asyncio.to_thread(
                    http, "PUT", url, json.dumps(body).encode(), self.api_headers
                )
            except OSError as exc:
                status, answer = 0, str(exc).encode()
            if status == 200 and json.loads(answer).get("changed"):
                version = int(json.loads(answer)["version"])
                self.counts.publishes += 1
            else:
                self.counts.publish_errors += 1
                self.counts.failed(f"publish {status}: {answer[:200]!r}")

    async def _sample(self, start: float) -> None:
        """Append one sample and print it. /proc is read before this sample's own /metrics
        request, so that request's socket is never among the fds counted."""
        pid = self.server.proc.pid
        now, cpu = time.monotonic(), cpu_seconds(pid)
        rss_mib, threads = proc_status(pid)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        text = await asyncio.to_thread(self.server.metrics)
        if self.redis is not None:
            state_keys = await asyncio.to_thread(self.redis.client.dbsize)
        else:
            state_keys = int(metric(text, "sluice_memory_backend_keys"))
        counts = self.counts
        latencies, counts.latencies_s = sorted(counts.latencies_s), []
        over_limit, counts.over_limit = counts.over_limit, 0
        since, cpu_since = self._previous or (now, cpu)
        self._previous = now, cpu
        interval = now - since or float("nan")  # nan for the first sample: no interval yet
        sample = Sample(
            t_s=round(now - start, 1),
            rss_mib=round(rss_mib, 2),
            fds=fds,
            threads=threads,
            cpu_pct=round(100 * (cpu - cpu_since) / interval, 1),
            rate=round(len(latencies) / interval, 1),
            p99_ms=round(percentile(latencies, 0.99) * 1000, 2),
            over_limit_pct=round(100 * over_limit / len(latencies), 1) if latencies else 0.0,
            errors=counts.errors,
            server_errors=self.server.grpc_errors(text),
            state_keys=state_keys,
            reloads=int(metric(text, "sluice_config_loads_total")),
        )
        self.samples.append(sample)
        print(row(sample), flush=True)


# --- the verdict -----------------------------------------------------------------------------

COLUMNS = (
    ("t_s", "t s", 6),
    ("rss_mib", "RSS MiB", 8),
    ("fds", "fds", 4),
    ("threads", "thr", 4),
    ("cpu_pct", "CPU %", 6),
    ("rate", "calls/s", 8),
    ("p99_ms", "p99 ms", 7),
    ("over_limit_pct", "over %", 7),
    ("errors", "errors", 7),
    ("server_errors", "srv err", 8),
    ("state_keys", "keys", 7),
    ("reloads", "reloads", 8),
)


def header() -> str:
    return " ".join(f"{title:>{width}}" for _, title, width in COLUMNS)


def row(sample: Sample) -> str:
    return " ".join(f"{getattr(sample, name):>{width}}" for name, _, width in COLUMNS)


@dataclass
class Verdict:
    rss_start_mib: float
    rss_end_mib: float
    rss_max_mib: float
    slope_mib_per_min: float  # second half, least squares
    slope_pct_per_min: float
    slope_bytes_per_call: float
    max_slope_mib_per_min: float
    rss_flat: bool
    fds_min: int
    fds_max: int
    fds_second_half: tuple[int, int]
    fds_flat: bool
    calls: int
    rate: float
    errors: int
    server_errors: int
    http_calls: int
    publishes: int
    reloads: int

    @property
    def ok(self) -> bool:
        # Every publish must have gone live: a reload that stopped happening is a failure too.
        reloaded = self.reloads >= self.publishes + 1
        failures = self.errors or self.server_errors
        return self.rss_flat and self.fds_flat and reloaded and not failures


def judge(samples: list[Sample], counts: Counts, duration_s: float) -> Verdict:
    half = [s for s in samples if s.t_s >= duration_s / 2]
    fit = statistics.linear_regression([s.t_s for s in half], [s.rss_mib for s in half])
    slope = fit.slope * 60  # MiB per minute
    span_min = (half[-1].t_s - half[0].t_s) / 60
    achieved = counts.calls / samples[-1].t_s
    max_slope = max(
        LEAK_BYTES_PER_CALL * achieved * 60 / MIB,
        1.5 * ALLOCATOR_STEP_MIB / span_min,
    )
    half_fds = [s.fds for s in half]
    return Verdict(
        rss_start_mib=samples[0].rss_mib,
        rss_end_mib=samples[-1].rss_mib,
        rss_max_mib=max(s.rss_mib for s in samples),
        slope_mib_per_min=slope,
        slope_pct_per_min=100 * slope / half[0].rss_mib,
        slope_bytes_per_call=slope * MIB / 60 / achieved if achieved else float("nan"),
        max_slope_mib_per_min=max_slope,
        rss_flat=slope <= max_slope,
        fds_min=min(s.fds for s in samples),
        fds_max=max(s.fds for s in samples),
        fds_second_half=(min(half_fds), max(half_fds)),
        fds_flat=max(half_fds) - min(half_fds) <= FD_SLACK,
        calls=counts.calls + counts.grpc_errors,
        rate=achieved,
        errors=counts.errors,
        server_errors=samples[-1].server_errors,
        http_calls=counts.http_calls,
        publishes=counts.publishes,
        reloads=samples[-1].reloads,
    )


def report(v: Verdict, counts: Counts) -> str:
    flat = {True: "FLAT", False: "NOT FLAT"}
    lines = [
        f"RSS: start {v.rss_start_mib:.1f} MiB, end {v.rss_end_mib:.1f} MiB, "
        f"max {v.rss_max_mib:.1f} MiB",
        f"RSS over the second half: {v.slope_mib_per_min:+.3f} MiB/min "
        f"({v.slope_pct_per_min:+.3f} %/min, {v.slope_bytes_per_call:+.1f} bytes/call); "
        f"threshold {v.max_slope_mib_per_min:.3f} MiB/min: {flat[v.rss_flat]}",
        f"fds: min {v.fds_min}, max {v.fds_max}; second half {v.fds_second_half[0]}–"
        f"{v.fds_second_half[1]} (slack {FD_SLACK}): {flat[v.fds_flat]}",
        f"gRPC calls {v.calls:,} ({v.rate:.1f}/s answered), /json calls {v.http_calls}, "
        f"errors {v.errors} (server-counted gRPC errors {v.server_errors})",
        f"publishes {v.publishes}, reloads {v.reloads} (the initial load included)",
    ]
    if counts.last_errors:
        lines.append("first errors:")
        lines += [f"  {e}" for e in counts.last_errors]
    lines.append(f"verdict: {'PASS' if v.ok else 'FAIL'}")
    return "\n".join(lines)


def write_out(path: Path, samples: list[Sample], verdict: Verdict, args: dict[str, object]) -> None:
    if path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[name for name, *_ in COLUMNS])
            writer.writeheader()
            writer.writerows(asdict(s) for s in samples)
    else:
        body = {"args": args, "samples": [asdict(s) for s in samples], "verdict": asdict(verdict)}
        path.write_text(json.dumps(body, indent=2) + "\n")


# --- processes -------------------------------------------------------------------------------


@contextlib.contextmanager
def serving(
    workdir: Path, redis: Redis | None, token: str, log_level: str, server_args: list[str]
) -> Iterator[Server]:
    """``sluice serve`` with the soak's policy, healthy; stopped (SIGTERM) at the end."""
    policy = workdir / "policy.yaml"
    policy.write_text(policy_yaml(1))
    extra_args = ["--shutdown-grace-s", "1", "--log-level", log_level]
    if redis is not None:
        extra_args += ["--backend", "redis", "--redis-url", redis.url]
    extra_args += server_args
    with sluice_serve(
        workdir,
        config=policy,
        database_url=f"sqlite:///{workdir / 'soak.db'}",
        extra_args=extra_args,
        # The token in the environment, not on the command line where `ps` shows it.
        env={"SLUICE_API_TOKEN": token},
    ) as sluice:
        yield Server(sluice.process, sluice.grpc_port, sluice.http_port, sluice.log_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Soak Sluice; judge RSS and fds.")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds [600]")
    parser.add_argument("--rate", type=float, default=300.0, help="gRPC calls per second [300]")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds per sample [10]")
    parser.add_argument("--publish-every", type=float, default=60.0, help="seconds [60]")
    parser.add_argument("--redis", action="store_true", help="Redis backend (private server)")
    parser.add_argument("--out", type=Path, help="write the samples: .csv, else JSON")
    parser.add_argument("--workdir", type=Path, help="keep the database and server log here")
    parser.add_argument("--log-level", default="INFO", help="the server's [INFO]")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="one more argument for sluice serve, e.g. --server-arg=--redis-timeout-ms=500",
    )
    args = parser.parse_args(argv)
    if args.duration < 4 * args.interval:
        parser.error("--duration must cover at least 4 samples (the verdict fits the last half)")

    with tempfile.TemporaryDirectory(prefix="sluice-soak-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(16)
        redis = Redis(workdir, cpu=None) if args.redis else None
        try:
            with serving(workdir, redis, token, args.log_level, args.server_arg) as server:
                print(
                    f"soak: {'redis' if redis else 'memory'} backend, {args.rate:g} calls/s for "
                    f"{args.duration:g} s, server pid {server.proc.pid}",
                    flush=True,
                )
                print(header(), flush=True)
                soak = Soak(args, server, redis, token)
                asyncio.run(soak.run())
        finally:
            if redis is not None:
                redis.close()
        if server.proc.returncode not in (0, -signal.SIGTERM):
            print(f"sluice serve exited with {server.proc.returncode}:")
            print(server.log.read_text()[-2000:])
            return 1
    verdict = judge(soak.samples, soak.counts, args.duration)
    print(report(verdict, soak.counts))
    if args.out:
        write_out(args.out, soak.samples, verdict, {k: str(v) for k, v in vars(args).items()})
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
