"""The Redis backend's own cost, in process: ``RedisBackend.apply`` called by many concurrent
tasks (as concurrent gRPC calls would) against a private ``redis-server`` pinned to another
core. Prints this process's CPU per call (the client path: batching, encoding, the socket,
decoding) and redis-server's CPU per call and per script call.

It is the quick loop for the Redis client path and the Lua scripts (seconds, far less noise
than a load test); ``bench/run.py`` remains the measure that counts.

    python bench/redis_path.py             # fixed_window and gcra, 1 and 3 descriptors
    python bench/redis_path.py --algorithms fixed_window --descriptors 3 --profile out.prof
    python bench/redis_path.py --young-gc-threshold 700   # Python's default collector setting
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import inspect
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from sluice.algorithms import ALGORITHMS, Limit  # noqa: E402
from sluice.app import YOUNG_GC_THRESHOLD  # noqa: E402
from sluice.backends import Hit  # noqa: E402
from sluice.backends.redis.backend import RedisBackend  # noqa: E402
from sluice.backends.redis.connect import connect  # noqa: E402
from tests.support.processes import free_port, redis_server_args, wait_until  # noqa: E402

_HAS_LEAN = "lean_client" in inspect.signature(RedisBackend).parameters
LIMIT = 4_294_967_295  # every hit admitted: the admitted path, as bench/run.py measures


def redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def drive(backend: RedisBackend, hits: list[Hit], calls: int, tasks: int) -> None:
    per_task = calls // tasks

    async def worker() -> None:
        for _ in range(per_task):
            await backend.apply(hits, time.time())

    await asyncio.gather(*(worker() for _ in range(tasks)))


async def measure(
    args: argparse.Namespace, url: str, admin: redis.Redis, algorithm: str, descriptors: int
) -> str:
    limit = Limit(LIMIT, 1, ALGORITHMS[algorithm], LIMIT if algorithm != "fixed_window" else 0)
    hits = [Hit(("bench", "user", f"u{i}"), (limit,), 1) for i in range(descriptors)]
    # A version from before the lean path (sys.path pointed at its server/) has no choice.
    options = {"lean_client": args.client == "lean"} if _HAS_LEAN else {}
    backend = RedisBackend(connect(url, timeout_s=2), key_prefix="bench:", **options)
    await drive(backend, hits, 2000, args.tasks)  # warm: connections, the script cache
    admin.config_resetstat()
    redis0, cpu0, wall0 = redis_cpu_s(admin), time.process_time(), time.perf_counter()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    await drive(backend, hits, args.calls, args.tasks)
    if profiler:
        profiler.disable()
        profiler.dump_stats(f"{args.profile}.{algorithm}.{descriptors}")
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    redis_s = redis_cpu_s(admin) - redis0
    scripts = sum(
        int(stat["calls"])
        for name, stat in admin.info("commandstats").items()
        if name in ("cmdstat_evalsha", "cmdstat_eval")
    )
    await backend.close()
    calls = args.calls // args.tasks * args.tasks
    client = args.client if _HAS_LEAN else "redis-py (before the lean path)"
    return (
        f"| {client} | {algorithm} | {descriptors} | {cpu / calls * 1e6:.1f} "
        f"| {calls / wall:,.0f} "
        f"| {redis_s / calls * 1e6:.1f} | {calls / max(scripts, 1):.1f} |"
    )


async def main_async(args: argparse.Namespace, url: str, admin: redis.Redis) -> None:
    print(
        "| client | algorithm | descriptors | client CPU µs/call | calls/s | Redis CPU µs/call "
        "| calls per script call |"
    )
    print("|---|---|---|---|---|---|---|")
    for algorithm in args.algorithms:
        for descriptors in args.descriptors:
            for _ in range(args.repeat):
                print(await measure(args, url, admin, algorithm, descriptors), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--tasks", type=int, default=64, help="concurrent callers")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--algorithms", nargs="+", default=["fixed_window", "gcra"])
    parser.add_argument("--descriptors", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--redis-cpu", type=int, default=1, help="core for redis-server")
    parser.add_argument("--cpu", type=int, default=0, help="core for this process")
    parser.add_argument(
        "--client",
        choices=("lean", "redis-py"),
        default="lean",
        help="the backend's script calls on wire.ScriptConnection or through redis-py",
    )
    parser.add_argument("--profile", help="write a cProfile of each measurement here")
    parser.add_argument(
        "--young-gc-threshold",
        type=int,
        default=YOUNG_GC_THRESHOLD,
        help="the start-up heap frozen and the young generation collected every N allocations,"
        f" as a server does (default {YOUNG_GC_THRESHOLD}; Python's own is 700)",
    )
    args = parser.parse_args()
    import os

    os.sched_setaffinity(0, {args.cpu})
    gc.collect()
    gc.freeze()
    gc.set_threshold(args.young_gc_threshold, *gc.get_threshold()[1:])
    with tempfile.TemporaryDirectory(prefix="sluice-redis-path-") as workdir:
        port = free_port()
        command = ["taskset", "-c", str(args.redis_cpu), "redis-server"]
        proc = subprocess.Popen(
            [*command, *redis_server_args(Path(workdir), port)], stdout=subprocess.DEVNULL
        )
        admin = redis.Redis(port=port)
        try:

            def answers() -> bool:
                try:
                    return bool(admin.ping())
                except redis.ConnectionError:
                    return False

            wait_until(answers, 5, "redis-server")
            asyncio.run(main_async(args, f"redis://127.0.0.1:{port}/0", admin))
        finally:
            admin.close()
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
