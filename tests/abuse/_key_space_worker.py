"""Distinct descriptor values through one rule, in a process of their own, reporting memory.

Run by tests/abuse/test_key_space.py as ``python -m tests.abuse._key_space_worker VALUES
MAX_KEYS CACHE_KEYS``, so the resident set it reads from /proc/self/status is this work's
alone. Each value comes twice in one request (64 descriptors, the default maximum: 32
values), so each is admitted once and refused once: every value makes a counter in the
memory backend, a remembered refusal in the over-limit cache and an offender in the usage
recorder's heavy hitters. It prints one JSON line per sample, then one with the totals.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time

from sluice.backends.memory import MemoryBackend
from sluice.backends.over_limit_cache import OverLimitCache
from sluice.clock import ManualClock
from sluice.limiter import RateLimiter
from sluice.model import Code, Descriptor, RateLimitRequest
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.usage.recorder import ALLOWED, OVER_LIMIT, UsageRecorder

POLICY = """
domain: keys
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 1}
"""
VALUES_PER_REQUEST = 32
SAMPLES = 20


def rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


async def drive(values: int, max_keys: int, cache_keys: int) -> None:
    snapshot = Snapshot(load_text(POLICY))
    memory = MemoryBackend(max_keys=max_keys)
    cache = OverLimitCache(memory, max_keys=cache_keys)
    recorder = UsageRecorder()
    clock = ManualClock(1_700_000_000.0)
    limiter = RateLimiter(lambda: snapshot, cache, clock, recorder=recorder)
    every = values // SAMPLES
    started = time.perf_counter()

    def sample(done: int) -> None:
        gc.collect()
        line = {
            "values": done,
            "rss_kb": rss_kb(),
            "backend_keys": len(memory),
            "cache_keys": len(cache),
            "seconds": round(time.perf_counter() - started, 2),
        }
        print(json.dumps(line), flush=True)

    sample(0)
    for first in range(0, values, VALUES_PER_REQUEST):
        descriptors = []
        for n in range(first, min(first + VALUES_PER_REQUEST, values)):
            descriptor = Descriptor((("client", f"203.0.113.{n % 256}/{n}"),))
            descriptors += (descriptor, descriptor)
        decision = await limiter.should_rate_limit(RateLimitRequest("keys", tuple(descriptors)))
        codes = [s.code for s in decision.statuses]
        assert codes == [Code.OK, Code.OVER_LIMIT] * (len(codes) // 2), codes
        done = first + len(descriptors) // 2
        if done // every != first // every:
            sample(done)
        clock.advance(0.0001)
    usage = recorder.drain()
    totals = {
        "rules": len(usage),
        "allowed": sum(u.counts[ALLOWED] for u in usage.values()),
        "over_limit": sum(u.counts[OVER_LIMIT] for u in usage.values()),
        "offenders": max(len(u.offenders or ()) for u in usage.values()),
        "evictions": memory.evictions,
        "cache_evictions": cache.evictions,
    }
    print(json.dumps(totals), flush=True)


if __name__ == "__main__":
    asyncio.run(drive(*(int(arg) for arg in sys.argv[1:4])))
