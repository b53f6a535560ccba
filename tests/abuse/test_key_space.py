"""Key-space explosion: a million distinct descriptor values through one rule.

(a) In memory, in a process of its own (tests/abuse/_key_space_worker.py): the memory
    backend never holds more than its --memory-max-keys, and once that bound is reached the
    resident set stops growing; the over-limit cache and the usage recorder's heavy hitters
    stay within theirs. The RSS samples are printed (run with -s to see them).
(b) Against a real, private Redis, driven in-process with enough concurrency that requests
    share script calls: every key written, by every algorithm, admitted, refused, checked
    without consuming or never fitting, carries a TTL.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from sluice.algorithms import ALGORITHMS
from sluice.backends.over_limit_cache import OverLimitCache
from sluice.backends.redis.backend import RedisBackend
from sluice.backends.redis.connect import connect
from sluice.clock import SystemClock
from sluice.limiter import RateLimiter
from sluice.model import Code, Descriptor, RateLimitRequest
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from tests.abuse._volume import cases

ROOT = Path(__file__).resolve().parents[2]

MEMORY_VALUES = 1_000_000
MEMORY_MAX_KEYS = 100_000  # --memory-max-keys
CACHE_MAX_KEYS = 10_000  # --local-cache-max-keys
TOP_KEYS = 20  # the recorder's heavy hitters per rule


# About a minute of CPU (two descriptors per value through the whole limiter): more than the
# suite's default per-test timeout on a shared machine.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_million_values_keep_memory_within_its_bound() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.abuse._key_space_worker",
            str(MEMORY_VALUES),
            str(MEMORY_MAX_KEYS),
            str(CACHE_MAX_KEYS),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    *samples, totals = [json.loads(line) for line in result.stdout.splitlines()]
    print(f"\n{'values':>9} {'RSS MiB':>8} {'backend keys':>13} {'cache keys':>11} {'s':>6}")
    for s in samples:
        print(
            f"{s['values']:>9} {s['rss_kb'] / 1024:>8.1f} {s['backend_keys']:>13} "
            f"{s['cache_keys']:>11} {s['seconds']:>6}"
        )
    print(totals)

    assert samples[-1]["values"] == MEMORY_VALUES
    assert all(s["backend_keys"] <= MEMORY_MAX_KEYS for s in samples)
    assert all(s["cache_keys"] <= CACHE_MAX_KEYS for s in samples)
    assert samples[-1]["backend_keys"] == MEMORY_MAX_KEYS
    assert totals["evictions"] == MEMORY_VALUES - MEMORY_MAX_KEYS
    assert totals["cache_evictions"] == MEMORY_VALUES - CACHE_MAX_KEYS
    # The usage recorder: one rule's counters, and only its top offenders kept.
    assert (totals["rules"], totals["allowed"], totals["over_limit"], totals["offenders"]) == (
        1,
        MEMORY_VALUES,
        MEMORY_VALUES,
        TOP_KEYS,
    )
    # Flat once full: what the filling cost per value, against what each value costs after.
    # Past twice the bound the expiry bookkeeping has reached its own cap (2x, compacted).
    start = samples[0]
    full = next(s for s in samples if s["values"] >= 2 * MEMORY_MAX_KEYS)
    end = samples[-1]
    filling = (full["rss_kb"] - start["rss_kb"]) / full["values"]
    after = (end["rss_kb"] - full["rss_kb"]) / (end["values"] - full["values"])
    print(f"RSS per value: {filling * 1024:.0f} B while filling, {after * 1024:.1f} B after")
    assert after < filling / 5, (filling, after)
    # An unbounded store would have grown by filling * 10^6; the whole run stays far below.
    assert end["rss_kb"] - start["rss_kb"] < filling * MEMORY_VALUES / 3


# --- Redis: every key expires ---------------------------------------------------------------------

REDIS_VALUES = cases(ci=50_000, nightly=1_000_000)
CONCURRENCY = 256
ALGORITHM_POLICY = """
domain: keys
descriptors:
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: sliding_window_log
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: sliding_window_log}
  - key: sliding_window_counter
    rate_limit: {unit: day, requests_per_unit: 1, algorithm: sliding_window_counter}
  - key: token_bucket
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket}
  - key: leaky_bucket
    rate_limit: {unit: week, requests_per_unit: 1, algorithm: leaky_bucket}
  - key: gcra
    rate_limit: {unit: year, requests_per_unit: 1, algorithm: gcra}
  - key: all
    rate_limit:
      limits:
        - {unit: second, requests_per_unit: 1}
        - {unit: month, requests_per_unit: 1, algorithm: sliding_window_counter}
        - {unit: hour, requests_per_unit: 1, algorithm: gcra}
"""
RULE_KEYS = [*ALGORITHMS, "all"]  # a rule each, and one with several limits


def request(n: int) -> RateLimitRequest:
    """Value ``n`` on one rule (by turns): hit twice (admitted, then refused), plus now and
    then a check that consumes nothing, or a cost that can never fit."""
    entries = ((RULE_KEYS[n % len(RULE_KEYS)], f"v{n}"),)
    descriptors = [Descriptor(entries), Descriptor(entries)]
    if n % 5 == 0:
        descriptors.insert(0, Descriptor(entries, hits_addend=0))
    if n % 11 == 0:
        descriptors.append(Descriptor(entries, hits_addend=2**40))
    return RateLimitRequest("keys", tuple(descriptors))


@pytest.mark.slow
@pytest.mark.timeout(cases(ci=120, nightly=3600))
def test_no_redis_key_is_left_without_a_ttl(redis_server: str) -> None:
    prefix = "abuse:"
    backend = RedisBackend(connect(redis_server, timeout_s=5), key_prefix=prefix)
    snapshot = Snapshot(load_text(ALGORITHM_POLICY))
    limiter = RateLimiter(lambda: snapshot, OverLimitCache(backend), SystemClock())
    refused = 0

    async def worker(first: int) -> None:
        nonlocal refused
        for n in range(first, REDIS_VALUES, CONCURRENCY):
            decision = await limiter.should_rate_limit(request(n))
            refused += decision.overall_code is Code.OVER_LIMIT

    async def drive() -> None:
        try:
            await asyncio.gather(*(worker(i) for i in range(CONCURRENCY)))
        finally:
            await backend.close()

    started = time.perf_counter()
    asyncio.run(drive())
    elapsed = time.perf_counter() - started

    client = redis.Redis.from_url(redis_server, socket_timeout=30)
    with client:
        keys = list(client.scan_iter(count=10_000))  # every key in this private Redis
        ttls: list[int] = []
        for chunk in range(0, len(keys), 10_000):
            with client.pipeline(transaction=False) as pipe:
                for key in keys[chunk : chunk + 10_000]:
                    pipe.pttl(key)
                ttls += pipe.execute()
    # PTTL: -1 is a key without a TTL; -2 a key that expired since the SCAN saw it (the
    # per-second limits' keys live about two seconds), which is what a TTL is for.
    without = [key for key, ttl in zip(keys, ttls, strict=True) if ttl == -1]
    expired = sum(ttl == -2 for ttl in ttls)
    print(
        f"\n{REDIS_VALUES} values, {backend.requests} requests in {elapsed:.1f} s, "
        f"{backend.script_calls} script calls; {len(keys)} keys scanned: "
        f"{len(keys) - expired - len(without)} with a TTL, {expired} expired since, "
        f"{len(without)} without a TTL"
    )
    # Every value was hit (the second hit refused) and left state in Redis: at least the
    # values of the five rules whose keys live an hour or more are all still there.
    assert refused == REDIS_VALUES
    assert backend.requests == REDIS_VALUES
    assert backend.script_calls < REDIS_VALUES / 10  # concurrent requests shared calls
    assert len(keys) >= REDIS_VALUES * 5 // len(RULE_KEYS)
    assert all(key.startswith(prefix.encode()) for key in keys)
    assert without == []
