"""What stalls the event loop of ``sluice serve --transport pyvoy`` under a fixed offered rate.

Starts Sluice (memory backend, the benchmark's rule) pinned to ``--server-cpu`` with the stall
probe of bench/loop_stalls_probe/ loaded into the interpreter Envoy embeds, drives it open
loop with h2load at ``--rate`` for ``--duration`` s on ``--load-cpu`` (after a 3 s warm-up),
and prints, for the measured window only: the latency percentiles, the loop's stalls
(a 1 ms timer late by over 2 ms) with the loop thread's own CPU time inside each (CPU ≈ the
stall: the loop was busy; far less: it waited, for the GIL or for the core), the cyclic
collections by generation (loop-thread CPU), and the CPU of each kind of background job run
in a thread (held with the GIL, in part).

    python bench/loop_stalls.py --rate 3000 --duration 60

Environment variables given to this command reach the server (e.g. to compare a setting).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import run as bench  # noqa: E402
from loadgen import h2load_command  # noqa: E402

PROBE = Path(__file__).resolve().parent / "loop_stalls_probe"


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=3000.0, help="offered req/s")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--load-cpu", type=int, default=1)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sluice-stalls-"))
    probe_out = work / "probe.jsonl"
    os.environ["SLUICE_STALL_PROBE"] = str(probe_out)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(PROBE), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    target = bench.Target(name="memory-fixed_window-pyvoy", kind="sluice", transport="pyvoy")
    log = work / "h2load.log"
    with bench.serving(target, work, args.server_cpu, None) as server:
        body = work / "body"
        body.write_bytes(bench.workload_for(target, 1000, 1).grpc_body())

        def h2load(duration_s: float, log_path: Path) -> None:
            command = h2load_command(
                server.target,
                body,
                log_path,
                mode="rate",
                duration_s=duration_s,
                warmup_s=0,
                connections=args.connections,
                streams=args.streams,
                rate=args.rate,
                cpus=(args.load_cpu,),
            )
            subprocess.run(command, capture_output=True, check=True)

        h2load(3, work / "warm-up.log")
        cpu_before = bench.cpu_seconds(server.pid)
        h2load(args.duration, log)
        cpu_after = bench.cpu_seconds(server.pid)
        bench.wait_until(lambda: probe_out.exists(), 5, "the probe's output")
        written = probe_out.stat().st_size
        bench.wait_until(lambda: probe_out.stat().st_size > written, 5, "the probe's last write")

    calls = []  # (start, epoch ms; duration, ms)
    for line in log.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 3:
            calls.append((int(fields[0]) / 1000, int(fields[2]) / 1000))
    start = min(s for s, _ in calls)
    end = max(s + d for s, d in calls)
    latencies = sorted(d for _, d in calls)
    events = [json.loads(line) for line in probe_out.read_text().splitlines()]
    events = [e for e in events if start <= e[0] <= end]

    print(f"load average: {os.getloadavg()[0]:.2f} (1 min, after)")
    print(
        f"{len(calls):,} calls at {args.rate:g} req/s offered over {args.duration:g} s; server "
        f"core {100 * (cpu_after - cpu_before) / args.duration:.0f}% busy\n"
        f"latency ms: p50 {percentile(latencies, 0.5):.2f}, p99 {percentile(latencies, 0.99):.2f}"
        f", p99.9 {percentile(latencies, 0.999):.2f}, max {latencies[-1]:.2f}; "
        f"{sum(d > 20 for d in latencies)} calls over 20 ms"
    )
    lags = [e for e in events if e[1] == "lag"]
    busy = sorted((e[3] for e in lags), reverse=True)
    longest = max((e[2] for e in lags), default=0)
    print(
        f"loop stalls (timer > 2 ms late): {len(lags)}, longest {longest:.1f} "
        f"ms; the loop's own CPU inside them: > 5 ms {sum(b > 5 for b in busy)}, "
        f"> 20 ms {sum(b > 20 for b in busy)}, largest {[round(b, 1) for b in busy[:5]]}"
    )
    for generation in (0, 1, 2):
        cpu = [e[4] for e in events if e[1] == "gc" and e[2] == generation]
        if cpu:
            print(
                f"gc generation {generation}: {len(cpu)} collections over 0.3 ms, "
                f"CPU total {sum(cpu):.1f} ms, largest {max(cpu):.2f} ms"
            )
    jobs: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e[1] == "thread":
            jobs[e[2]].append(e[3])
    for name, cpu in sorted(jobs.items()):
        print(
            f"thread job {name}: {len(cpu)} runs, CPU mean {sum(cpu) / len(cpu):.2f} ms, "
            f"largest {max(cpu):.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
