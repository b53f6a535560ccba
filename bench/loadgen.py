"""Load for a ShouldRateLimit server: a Python (grpc.aio, multiprocessing) driver and h2load.

Two modes: ``peak`` (closed loop: a fixed number of calls in flight, as fast as the server
answers) and ``rate`` (open loop: calls start on a fixed schedule whatever the answers, so a
slow server shows up as latency rather than as a lower offered load).

The Python driver costs about as much CPU per call as the server it drives; h2load costs a
fraction of that (PERFORMANCE-NOTES.md), so it is the default driver for ``bench/run.py``.
h2load sends one request body for every call, so it names one key; the Python driver draws
each request from the key space.

Standalone: ``python bench/loadgen.py --port 8081 --driver python --mode peak --duration 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import multiprocessing as mp
import os
import random
import re
import resource
import shutil
import struct
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
CALL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Workload:
    """What each request asks: ``descriptors`` descriptors of one entry ``key=<value>``, the
    values drawn from ``keyspace`` distinct ones, or always ``fixed_value`` (a flood)."""

    domain: str = "bench"
    key: str = "user"
    keyspace: int = 1000
    descriptors: int = 1
    fixed_value: str | None = None

    def requests(self, count: int, seed: int = 0) -> list[bytes]:
        """``count`` serialized RateLimitRequests; serialized once so that the driver's own
        cost per call is the transport's, not protobuf's."""
        from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2

        rng = random.Random(seed)
        out = []
        for _ in range(count):
            message = rls_pb2.RateLimitRequest(domain=self.domain, hits_addend=1)
            for _ in range(self.descriptors):
                value = self.fixed_value or f"u{rng.randrange(self.keyspace)}"
                message.descriptors.add().entries.add(key=self.key, value=value)
            out.append(message.SerializeToString())
        return out

    def grpc_body(self, seed: int = 0) -> bytes:
        """One request as a gRPC message on the wire: uncompressed flag, length, message."""
        message = self.requests(1, seed)[0]
        return struct.pack(">BI", 0, len(message)) + message


@dataclass
class Result:
    driver: str
    mode: str
    duration_s: float
    calls: int  # completed calls, whatever their status
    errors: int  # failed calls (for h2load: transport failures only, see run_h2load)
    rps: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    client_cpu_us_per_call: float
    offered_rps: float | None = None
    max_ms: float = float("nan")
    over_20ms: int = 0  # calls slower than 20 ms (the tail goal: none)
    notes: list[str] = field(default_factory=list)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (nan when empty)."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[rank]


def _summary(
    driver: str,
    mode: str,
    duration_s: float,
    calls: int,
    errors: int,
    latencies_s: list[float],
    client_cpu_s: float,
    offered_rps: float | None,
) -> Result:
    latencies_s.sort()
    ms = [percentile(latencies_s, q) * 1000 for q in (0.50, 0.99, 0.999)]
    over_20ms = len(latencies_s) - bisect.bisect_right(latencies_s, 0.020)
    return Result(
        driver=driver,
        mode=mode,
        duration_s=duration_s,
        calls=calls,
        errors=errors,
        rps=(calls - errors) / duration_s if duration_s > 0 else 0.0,
        p50_ms=ms[0],
        p99_ms=ms[1],
        p999_ms=ms[2],
        client_cpu_us_per_call=client_cpu_s / calls * 1e6 if calls else float("nan"),
        offered_rps=offered_rps,
        max_ms=latencies_s[-1] * 1000 if latencies_s else float("nan"),
        over_20ms=over_20ms,
    )


# --- the Python driver -----------------------------------------------------------------------


@dataclass(frozen=True)
class _WorkerPlan:
    target: str
    workload: Workload
    mode: str
    warmup_s: float
    duration_s: float
    channels: int
    concurrency: int
    rate: float  # this worker's share of the open-loop rate
    cpus: tuple[int, ...] | None
    seed: int


def _worker(plan: _WorkerPlan, barrier: object, results: object) -> None:
    if plan.cpus:
        os.sched_setaffinity(0, set(plan.cpus))
    results.put(asyncio.run(_worker_main(plan, barrier)))  # type: ignore[attr-defined]


async def _worker_main(plan: _WorkerPlan, barrier: object) -> dict[str, object]:
    import grpc

    pool = plan.workload.requests(max(1, min(plan.workload.keyspace, 4096)), plan.seed)
    # A local subchannel pool: otherwise every channel of a process shares one connection.
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [
        grpc.aio.insecure_channel(plan.target, options=options) for _ in range(plan.channels)
    ]
    # No (de)serializers: the pool is already bytes, and the answer is not inspected.
    calls = [
        c.unary_unary(METHOD, request_serializer=None, response_deserializer=None) for c in channels
    ]
    for channel in channels:
        await asyncio.wait_for(channel.channel_ready(), 10)
    await asyncio.get_running_loop().run_in_executor(None, barrier.wait)  # type: ignore[attr-defined]

    rng = random.Random(plan.seed)
    start = time.monotonic()
    measure_from = start + plan.warmup_s
    end = measure_from + plan.duration_s
    latencies: list[float] = []
    counts = {"calls": 0, "errors": 0, "all": 0}
    cpu_start = resource.getrusage(resource.RUSAGE_SELF)

    async def one(call: object, body: bytes, t0: float) -> None:
        ok = True
        try:
            await call(body, timeout=CALL_TIMEOUT_S)  # type: ignore[operator]
        except grpc.aio.AioRpcError:
            ok = False
        t1 = time.monotonic()
        counts["all"] += 1
        if t0 >= measure_from and t1 <= end + CALL_TIMEOUT_S:
            counts["calls"] += 1
            if ok:
                latencies.append(t1 - t0)
            else:
                counts["errors"] += 1

    if plan.mode == "peak":

        async def loop(call: object) -> None:
            while (t0 := time.monotonic()) < end:
                await one(call, pool[rng.randrange(len(pool))], t0)

        await asyncio.gather(*(loop(calls[i % len(calls)]) for i in range(plan.concurrency)))
    else:
        # Open loop: latency counts from when a call was due, not when it could be sent, so a
        # server that falls behind is not hidden by a driver that waits for it.
        interval = 1.0 / plan.rate
        due = start
        n = 0
        inflight: set[asyncio.Task[None]] = set()
        shed = 0
        while due < end:
            now = time.monotonic()
            while due <= now and due < end:
                if len(inflight) >= plan.concurrency:
                    shed += 1  # more outstanding than allowed: the server is saturated
                    if due >= measure_from:
                        counts["calls"] += 1
                        counts["errors"] += 1
                else:
                    task = asyncio.create_task(
                        one(calls[n % len(calls)], pool[rng.randrange(len(pool))], due)
                    )
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                n += 1
                due = start + n * interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        if inflight:
            await asyncio.wait(inflight, timeout=CALL_TIMEOUT_S)
    elapsed = time.monotonic() - measure_from
    cpu_end = resource.getrusage(resource.RUSAGE_SELF)
    for channel in channels:
        await channel.close()
    cpu = (cpu_end.ru_utime + cpu_end.ru_stime) - (cpu_start.ru_utime + cpu_start.ru_stime)
    return {
        "calls": counts["calls"],
        "errors": counts["errors"],
        "latencies": latencies,
        "elapsed": min(elapsed, plan.duration_s) if elapsed > 0 else plan.duration_s,
        # Warm-up calls cost CPU too: per call over every call this worker completed.
        "cpu_per_call": cpu / max(1, counts["all"]),
    }


def run_python(
    target: str,
    workload: Workload,
    *,
    mode: str,
    duration_s: float,
    warmup_s: float = 0.0,
    processes: int = 2,
    channels: int = 2,
    concurrency: int = 32,
    rate: float = 0.0,
    cpus: tuple[int, ...] | None = None,
) -> Result:
    """``processes`` processes of ``channels`` channels each; ``concurrency`` calls in flight
    per process (peak), or the most outstanding before a due call is shed (rate)."""
    if mode == "rate" and rate <= 0:
        raise ValueError("mode 'rate' needs a positive rate")
    # spawn, not fork: the parent may already hold gRPC state, which does not survive fork.
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes)
    queue = ctx.Queue()
    plans = [
        _WorkerPlan(
            target,
            workload,
            mode,
            warmup_s,
            duration_s,
            channels,
            concurrency,
            rate / processes,
            cpus,
            seed,
        )
        for seed in range(processes)
    ]
    workers = [ctx.Process(target=_worker, args=(p, barrier, queue)) for p in plans]
    for w in workers:
        w.start()
    parts = [queue.get(timeout=duration_s + warmup_s + 60) for _ in workers]
    for w in workers:
        w.join()
    latencies = [x for p in parts for x in p["latencies"]]  # type: ignore[union-attr]
    calls = sum(int(p["calls"]) for p in parts)  # type: ignore[call-overload]
    cpu = sum(float(p["cpu_per_call"]) * int(p["calls"]) for p in parts)  # type: ignore[arg-type]
    elapsed = max(float(p["elapsed"]) for p in parts)  # type: ignore[arg-type]
    return _summary(
        "python",
        mode,
        elapsed,
        calls,
        sum(int(p["errors"]) for p in parts),  # type: ignore[call-overload]
        latencies,
        cpu,
        rate if mode == "rate" else None,
    )


# --- h2load ----------------------------------------------------------------------------------


def h2load_available() -> bool:
    return shutil.which("h2load") is not None


def h2load_command(
    target: str,
    body_path: Path,
    log_path: Path,
    *,
    mode: str,
    duration_s: float,
    warmup_s: float,
    connections: int,
    streams: int,
    rate: float,
    cpus: tuple[int, ...] | None,
) -> list[str]:
    command = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
    command += [
        "h2load",
        "-D",
        f"{duration_s:g}",
        "-c",
        str(connections),
        "-m",
        str(streams),
        "-t",
        "1",
        "-d",
        str(body_path),  # makes it a POST carrying the gRPC frame
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",  # gRPC servers refuse a call without it
        "--log-file",
        str(log_path),
    ]
    if warmup_s > 0:
        command += ["--warm-up-time", f"{warmup_s:g}"]
    if mode == "rate":
        command += ["--rps", f"{rate / connections:.3f}"]
    return [*command, f"http://{target}{METHOD}"]


def run_h2load(
    target: str,
    workload: Workload,
    *,
    mode: str,
    duration_s: float,
    warmup_s: float = 0.0,
    connections: int = 4,
    streams: int = 32,
    rate: float = 0.0,
    cpus: tuple[int, ...] | None = None,
) -> Result:
    """h2load over ``connections`` connections, ``streams`` calls in flight on each.

    h2load only sees HTTP status: a call that fails with a gRPC status (HTTP 200 and a
    ``grpc-status`` trailer) counts as succeeded here; ``bench/run.py`` counts those from the
    server's side. Rate mode is h2load's ``--rps`` per connection, which is open loop only as
    long as a connection has a free stream."""
    if mode == "rate" and rate <= 0:
        raise ValueError("mode 'rate' needs a positive rate")
    with tempfile.TemporaryDirectory(prefix="sluice-h2load-") as tmp:
        body = Path(tmp, "body")
        body.write_bytes(workload.grpc_body())
        log = Path(tmp, "log")
        command = h2load_command(
            target,
            body,
            log,
            mode=mode,
            duration_s=duration_s,
            warmup_s=warmup_s,
            connections=connections,
            streams=streams,
            rate=rate,
            cpus=cpus,
        )
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=duration_s + warmup_s + 60
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise RuntimeError(f"h2load failed ({done.returncode}): {done.stderr or done.stdout}")
        latencies = []
        for line in log.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 3 and parts[1].startswith("2"):
                latencies.append(int(parts[2]) / 1e6)
    counts = re.search(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
        r"(\d+) errored, (\d+) timeout",
        done.stdout,
    )
    if counts is None:
        raise RuntimeError(f"cannot read h2load's output:\n{done.stdout}")
    calls = int(counts.group(3))
    errors = calls - int(counts.group(4))
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    result = _summary(
        "h2load", mode, duration_s, calls, errors, latencies, cpu, rate if mode == "rate" else None
    )
    # Warm-up calls are not in "done" but cost CPU: spread it over the measured ones.
    result.client_cpu_us_per_call *= duration_s / (duration_s + warmup_s)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="Drive ShouldRateLimit load at one server.")
    parser.add_argument("--target", default="127.0.0.1:8081")
    parser.add_argument("--driver", choices=("python", "h2load"), default="python")
    parser.add_argument("--mode", choices=("peak", "rate"), default="peak")
    parser.add_argument("--rate", type=float, default=0.0, help="calls/s for --mode rate")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=2, help="python driver")
    parser.add_argument("--channels", type=int, default=2, help="python driver, per process")
    parser.add_argument("--concurrency", type=int, default=32, help="python driver, per process")
    parser.add_argument("--connections", type=int, default=4, help="h2load")
    parser.add_argument("--streams", type=int, default=32, help="h2load, per connection")
    parser.add_argument("--cpus", default="", help="pin the driver to these cores, e.g. 1")
    parser.add_argument("--domain", default="bench")
    parser.add_argument("--key", default="user")
    parser.add_argument("--keyspace", type=int, default=1000)
    parser.add_argument("--descriptors", type=int, default=1)
    parser.add_argument("--fixed-value", default=None, help="every request names this value")
    args = parser.parse_args()
    cpus = tuple(int(c) for c in args.cpus.split(",") if c) or None
    workload = Workload(args.domain, args.key, args.keyspace, args.descriptors, args.fixed_value)
    if args.driver == "python":
        result = run_python(
            args.target,
            workload,
            mode=args.mode,
            duration_s=args.duration,
            warmup_s=args.warmup,
            processes=args.processes,
            channels=args.channels,
            concurrency=args.concurrency,
            rate=args.rate,
            cpus=cpus,
        )
    else:
        result = run_h2load(
            args.target,
            workload,
            mode=args.mode,
            duration_s=args.duration,
            warmup_s=args.warmup,
            connections=args.connections,
            streams=args.streams,
            rate=args.rate,
            cpus=cpus,
        )
    print(json.dumps(asdict(result), indent=2))


if __name__ == "__main__":
    main()
