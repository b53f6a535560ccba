"""CPU per call of each thread of the pyvoy server (Envoy with Sluice inside) at peak load:
the app's event loop (Python), Envoy's worker (HTTP/2, C++) and pyvoy's hand-off thread.

``bench/run.py`` gives the process's CPU per call; this says which thread spends it, so a
change to the Python path is seen apart from Envoy's fixed share. Same placement as run.py:
server on core 0, h2load (and Redis) on core 1.

    python bench/thread_cpu.py                     # memory and Redis fixed window, 10 s each
    python bench/thread_cpu.py --targets redis --duration 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loadgen import run_h2load  # noqa: E402
from run import Redis, Server, Target, serving, workload_for  # noqa: E402

TARGETS = {
    "memory": Target("memory-fixed_window-pyvoy", "sluice", "memory", transport="pyvoy"),
    "redis": Target("redis-fixed_window-pyvoy", "sluice", "redis", transport="pyvoy"),
}


def thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread of ``pid``: (name, user + system clock ticks so far)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        out[int(task.name)] = (name, int(fields[11]) + int(fields[12]))
    return out


def measure(server: Server, target: Target, duration_s: float, load_cpu: int) -> str:
    workload = workload_for(target, keyspace=1, descriptors=1)
    drive = {"connections": 8, "streams": 8, "cpus": (load_cpu,)}
    run_h2load(server.target, workload, mode="peak", duration_s=3, **drive)  # warm
    before = thread_ticks(server.pid)
    result = run_h2load(server.target, workload, mode="peak", duration_s=duration_s, **drive)
    after = thread_ticks(server.pid)
    ticks_per_s = 100  # USER_HZ
    per_call = {
        tid: (name, (ticks - before.get(tid, (name, 0))[1]) / ticks_per_s / result.calls * 1e6)
        for tid, (name, ticks) in after.items()
    }
    lines = [f"{target.name}: {result.rps:,.0f} req/s"]
    for tid, (name, us) in sorted(per_call.items(), key=lambda item: -item[1][1]):
        if us >= 0.5:
            lines.append(f"  thread {tid} ({name}): {us:.1f} µs/call")
    lines.append(f"  all threads: {sum(us for _, us in per_call.values()):.1f} µs/call")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="memory,redis", help="memory, redis")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--load-cpu", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-threads-") as tmp:
        workdir = Path(tmp)
        for name in args.targets.split(","):
            target = TARGETS[name]
            redis = Redis(workdir, args.load_cpu) if target.backend == "redis" else None
            try:
                with serving(target, workdir, args.server_cpu, redis) as server:
                    print(measure(server, target, args.duration, args.load_cpu), flush=True)
            finally:
                if redis is not None:
                    redis.close()


if __name__ == "__main__":
    main()
