"""What RLQS costs Sluice per bucket, in process (no sockets): a stream reporting N buckets,
each report answered, and a rebalance every second; with one stream (shares stay whole) and
with two on the same buckets (shares change with every report).

    python bench/rlqs_buckets.py                 # 10,000 buckets
    python bench/rlqs_buckets.py --buckets 1000

The numbers are per bucket; a data plane reports each of its buckets every 5 s and Sluice
rebalances every second, so the CPU share of N buckets is about
N x (report / 5 + rebalance) per second.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sluice.clock import ManualClock  # noqa: E402
from sluice.policies.snapshot import Snapshot  # noqa: E402
from sluice.policies.yaml_format import load_text  # noqa: E402
from sluice.rlqs.service import QuotaService  # noqa: E402
from tests.support.rlqs_streams import Collector, Feed  # noqa: E402

POLICY = """
domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000}
"""


async def measure(buckets: int, streams: int, rounds: int) -> tuple[float, float]:
    clock = ManualClock(1000.0)
    snapshot = Snapshot(load_text(POLICY, "policy.yaml"))
    service = QuotaService(lambda: snapshot, clock)
    feeds = [Feed() for _ in range(streams)]
    readers = [Collector(service.stream(feed)) for feed in feeds]
    report_s = rebalance_s = 0.0
    for n in range(rounds + 1):
        elapsed = 0.0 if n == 0 else 5.0
        expected = [len(reader.responses) + 1 for reader in readers]
        for i, feed in enumerate(feeds):
            counts = [({"tenant": str(b)}, elapsed, 100 * (i + 1) + n, n) for b in range(buckets)]
            feed.report(*counts, domain="bench")
        started = time.perf_counter()
        for reader, count in zip(readers, expected, strict=True):
            await reader.wait(count)
        if n:
            report_s += time.perf_counter() - started
        clock.advance(1)
        started = time.perf_counter()
        await service.rebalance()
        if n:
            rebalance_s += time.perf_counter() - started
        for reader in readers:
            await reader.settle()
            reader.responses.clear()
    for feed in feeds:
        feed.close()
    for reader in readers:
        await reader.close()
    per = buckets * streams * rounds
    return report_s / per * 1e6, rebalance_s / per * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--buckets", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{args.buckets} buckets per stream, {args.rounds} rounds; µs per bucket")
    print(f"{'streams':>8} {'report':>10} {'rebalance':>10}")
    for streams in (1, 2):
        report, rebalance = asyncio.run(measure(args.buckets, streams, args.rounds))
        print(f"{streams:>8} {report:>10.1f} {rebalance:>10.1f}")


if __name__ == "__main__":
    main()
