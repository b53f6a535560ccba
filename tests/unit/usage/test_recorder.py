"""What the limiter records per rule: allowed, over limit, shadow, near limit, offenders."""

from __future__ import annotations

import asyncio
import textwrap

from sluice.backends.memory import MemoryBackend
from sluice.clock import ManualClock
from sluice.limiter import RateLimiter
from sluice.model import Descriptor, RateLimitRequest
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.usage.recorder import OVER_LIMIT, UsageRecorder

POLICY = textwrap.dedent(
    """
    domain: d
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 5}
      - key: trial
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 1}
      - key: plan
        descriptors:
          - key: free
            rate_limit: {unlimited: true}
    """
)


def run(recorder: UsageRecorder, *descriptors: tuple[tuple[str, str], ...]) -> None:
    snapshot = Snapshot(load_text(POLICY))
    limiter = RateLimiter(lambda: snapshot, MemoryBackend(), ManualClock(0), recorder=recorder)
    for entries in descriptors:
        request = RateLimitRequest("d", (Descriptor(entries),))
        asyncio.run(limiter.should_rate_limit(request))


def test_counts_per_rule_with_near_limit_and_offenders() -> None:
    recorder = UsageRecorder()
    alice = (("user", "alice"),)
    run(
        recorder,
        *[alice] * 7,
        (("user", "bob"),),
        *[(("trial", "t"),)] * 3,
        (("plan", "p"), ("free", "f")),
    )
    usage = recorder.drain()
    # allowed, over, shadow, near, errors, blocked
    assert usage["d.user"].counts == [6, 2, 0, 2, 0, 0]
    assert usage["d.user"].offenders is not None
    assert usage["d.user"].offenders.top() == [("user,alice", 2)]
    assert usage["d.trial"].counts == [1, 0, 2, 1, 0, 0]
    assert usage["d.plan.free"].counts == [1, 0, 0, 0, 0, 0]
    assert recorder.drain() == {}


def test_near_limit_threshold() -> None:
    recorder = UsageRecorder(near_limit_ratio=0.8)
    assert recorder.is_near(10, 2)
    assert not recorder.is_near(10, 3)
    assert not recorder.is_near(0, 0)


def test_a_huge_hits_addend_counts_as_one_more_than_the_largest_limit() -> None:
    # hits_addend is a uint64 on the wire: a few of them would overflow the usage tables'
    # 64-bit integers, and every flush of those figures would fail from then on.
    recorder = UsageRecorder()
    for _ in range(3):
        recorder.record("d.user", OVER_LIMIT, cost=2**64 - 1, offender="bob")
    usage = recorder.drain()["d.user"]
    assert usage.counts[OVER_LIMIT] == 3 * 2**32
    assert usage.offenders is not None and usage.offenders.top() == [("bob", 3 * 2**32)]
