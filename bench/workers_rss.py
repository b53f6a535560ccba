"""Resident memory of ``sluice serve --workers N``: idle, then after a key-space load.

Starts a private redis-server and ``sluice serve --workers N --backend redis`` (``--transport``
grpcio or pyvoy), reads VmRSS of the supervisor, of each worker and (pyvoy) of each worker's
Envoy, sends ``--values`` distinct descriptor values through one rule limited to 1/hour
(each value twice in a request, as tests/abuse/_key_space_worker.py does: admitted once,
refused once, so each makes a Redis counter, a remembered refusal in the over-limit cache
and an offender in the usage recorder), and reads VmRSS again.

    python bench/workers_rss.py --transport pyvoy --workers 2 --values 320000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/support

from tests.support.processes import free_port, redis_server_args, sluice_serve, wait_until

POLICY = """domain: keys
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 1}
"""
VALUES_PER_REQUEST = 32  # each twice: 64 descriptors, the default --max-descriptors


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


def sample(supervisor: int) -> dict[str, float]:
    out = {"supervisor": rss_mib(supervisor)}
    for i, worker in enumerate(children(supervisor), 1):
        out[f"worker {i}"] = rss_mib(worker)
        for envoy in children(worker):
            out[f"worker {i} envoy"] = rss_mib(envoy)
    return out


async def load(target: str, values: int, concurrency: int) -> tuple[int, int]:
    import grpc

    from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(8)
    ]
    stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
    requests = values // VALUES_PER_REQUEST
    next_request = 0
    ok = errors = 0

    async def one_stream(n: int) -> None:
        nonlocal next_request, ok, errors
        stub = stubs[n % len(stubs)]
        while next_request < requests:
            r = next_request
            next_request += 1
            message = rls_pb2.RateLimitRequest(domain="keys")
            for v in range(VALUES_PER_REQUEST):
                value = f"c{r * VALUES_PER_REQUEST + v}"
                for _ in range(2):
                    message.descriptors.add().entries.add(key="client", value=value)
            try:
                await stub.ShouldRateLimit(message, timeout=30)
                ok += 1
            except grpc.aio.AioRpcError:
                errors += 1

    await asyncio.gather(*(one_stream(n) for n in range(concurrency)))
    for channel in channels:
        await channel.close()
    return ok, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", default="pyvoy", choices=("grpcio", "pyvoy"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--values", type=int, default=320_000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()

    import subprocess

    with tempfile.TemporaryDirectory(prefix="sluice-rss-") as tmp:
        workdir = Path(tmp)
        redis_port = free_port()
        redis = subprocess.Popen(
            ["redis-server", *redis_server_args(workdir, redis_port)], stdout=subprocess.DEVNULL
        )
        try:
            policy = workdir / "policy.yaml"
            policy.write_text(POLICY)
            extra = ["--workers", str(args.workers), "--transport", args.transport]
            extra += ["--backend", "redis", "--redis-url", f"redis://127.0.0.1:{redis_port}/0"]
            extra += ["--redis-timeout-ms", "1000", "--log-level", "WARNING"]
            with sluice_serve(workdir, config=policy, extra_args=extra) as server:
                supervisor = server.process.pid

                def all_serving() -> bool:
                    workers = children(supervisor)
                    return len(workers) == args.workers and (
                        args.transport == "grpcio" or all(children(w) for w in workers)
                    )

                wait_until(all_serving, 60, "every worker serving")
                time.sleep(3)  # idle: let start-up garbage settle before the first sample
                idle = sample(supervisor)
                started = time.monotonic()
                ok, errors = asyncio.run(load(server.grpc_target, args.values, args.concurrency))
                took = time.monotonic() - started
                loaded = sample(supervisor)
            print(
                f"{args.transport}, --workers {args.workers}: {args.values:,} values "
                f"({ok:,} calls, {errors} errors) in {took:.1f}s"
            )
            print("| process | idle (MiB) | after the key-space load (MiB) |")
            print("|---|---:|---:|")
            for name in idle:
                print(f"| {name} | {idle[name]:.0f} | {loaded.get(name, 0):.0f} |")
        finally:
            redis.terminate()
            redis.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
