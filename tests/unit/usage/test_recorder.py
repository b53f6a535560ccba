"""What the limiter records per rule: allowed, over limit, shadow, near limit, offenders."""

from __future__ import annotations

import asyncio
import textwrap

from hypothesis import given
from hypothesis import strategies as st

from sluice.backends.memory import MemoryBackend
from sluice.clock import ManualClock
from sluice.limiter import RateLimiter
from sluice.model import Descriptor, RateLimitRequest
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.usage.recorder import ALLOWED, NEAR_LIMIT, OVER_LIMIT, UsageRecorder, near_threshold

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
    # allowed, over, shadow, near, errors, blocked; near: past floor(5 × 0.8) = 4, alice's 5th
    assert usage["d.user"].counts == [6, 2, 0, 1, 0, 0]
    assert usage["d.user"].offenders is not None
    assert usage["d.user"].offenders.top() == [("user,alice", 2)]
    assert usage["d.trial"].counts == [1, 0, 2, 1, 0, 0]
    assert usage["d.plan.free"].counts == [1, 0, 0, 0, 0, 0]
    assert recorder.drain() == {}


def test_hits_are_counted_per_counter_admitted_and_refused_alike() -> None:
    # What the what-if replays per key: every decided hit of a limited or unlimited rule,
    # by the counter it went to.
    recorder = UsageRecorder()
    alice = (("user", "alice"),)
    run(recorder, *[alice] * 7, (("user", "bob"),), (("plan", "p"), ("free", "f")))
    usage = recorder.drain()
    assert usage["d.user"].keys == {("d", "user", "alice"): 7, ("d", "user", "bob"): 1}
    assert usage["d.plan.free"].keys == {("d", "plan", "p", "free", "f"): 1}


def test_keys_past_the_bound_count_in_the_totals_only() -> None:
    recorder = UsageRecorder(max_keys=2)
    for user in ("a", "b", "c", "a"):
        recorder.record("d.user", ALLOWED, key=("d", "user", user))
    usage = recorder.drain()["d.user"]
    assert usage.keys == {("d", "user", "a"): 2, ("d", "user", "b"): 1}
    assert usage.counts[ALLOWED] == 4


def test_near_limit_hits_are_those_past_upstreams_threshold() -> None:
    # envoyproxy/ratelimit: near when the count after the hit exceeds floor(limit × ratio),
    # and of a hit of cost n only the part past that threshold.
    recorder = UsageRecorder(near_limit_ratio=0.8)
    assert recorder.near_hits(10, 2, 1) == 0  # 8 used: at the threshold of 8, not past it
    assert recorder.near_hits(10, 1, 1) == 1
    assert recorder.near_hits(10, 0, 3) == 2  # 7 -> 10: the 9th and 10th
    assert recorder.near_hits(10, 0, 1) == 1
    assert recorder.near_hits(2, 0, 1) == 1  # floor(1.6) = 1
    assert recorder.near_hits(10, 1, 0) == 0  # a check that consumes nothing
    assert recorder.near_hits(0, 0, 0) == 0


def test_the_threshold_is_computed_in_float32_as_go_does() -> None:
    # float32(0.7) × 10 rounds to 7.0 in float32; in float64 it is 6.9999999…, floor 6.
    assert near_threshold(10, 0.7) == 7
    assert near_threshold(10, 0.9) == 9
    assert near_threshold(10, 0.8) == 8
    assert near_threshold(3, 0.8) == 2
    assert near_threshold(2**32 - 1, 0.8) == 3435973888  # float32(2**32 - 1) is 2**32


def test_near_counts_at_most_the_hits_recorded() -> None:
    recorder = UsageRecorder()
    recorder.record("d.user", ALLOWED, cost=2, near=5)
    assert recorder.drain()["d.user"].counts[NEAR_LIMIT] == 2


def test_a_huge_hits_addend_counts_as_one_more_than_the_largest_limit() -> None:
    # hits_addend is a uint64 on the wire: a few of them would overflow the usage tables'
    # 64-bit integers, and every flush of those figures would fail from then on.
    recorder = UsageRecorder()
    for _ in range(3):
        recorder.record("d.user", OVER_LIMIT, cost=2**64 - 1, offender="bob")
    usage = recorder.drain()["d.user"]
    assert usage.counts[OVER_LIMIT] == 3 * 2**32
    assert usage.offenders is not None and usage.offenders.top() == [("bob", 3 * 2**32)]


@given(
    limit=st.integers(min_value=0, max_value=2**32 - 1),
    ratio=st.floats(min_value=0.01, max_value=1.0),
    offset=st.integers(min_value=-3, max_value=3),
    cost=st.integers(min_value=0, max_value=5),
)
def test_near_hits_is_upstreams_count_whatever_the_limit_and_ratio(
    limit: int, ratio: float, offset: int, cost: int
) -> None:
    # Around the threshold, where the quick float64 estimate must never decide wrongly.
    threshold = near_threshold(limit, ratio)
    after = min(max(threshold + offset, 0), limit)
    expected = 0
    if after > threshold:
        expected = cost if after - cost >= threshold else after - threshold
    recorder = UsageRecorder(near_limit_ratio=ratio)
    assert recorder.near_hits(limit, limit - after, cost) == expected
