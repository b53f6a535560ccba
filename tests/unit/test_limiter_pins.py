"""Pins and resets in the decision, on a manual clock: overrides count on their own counter,
blocks refuse without counting, allows never limit, each only until it expires; a reset
starts the descriptor's counters afresh."""

from __future__ import annotations

import asyncio
import textwrap

from sluice.backends.memory import MemoryBackend
from sluice.clock import ManualClock
from sluice.limiter import UNLIMITED_REMAINING, LimiterSettings, RateLimiter
from sluice.model import Code, Descriptor, DescriptorStatus, LimitOverride, RateLimitRequest, Unit
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.usage.recorder import ALLOWED, BLOCKED, OVER_LIMIT, UsageRecorder

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z, on a minute boundary
RULES = """
domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


def limiter(
    extra: str = "", *, headers: bool = False
) -> tuple[RateLimiter, ManualClock, UsageRecorder]:
    [policy] = load_text(RULES + textwrap.dedent(extra))
    snapshot = Snapshot([policy])
    clock = ManualClock(T0)
    recorder = UsageRecorder()
    settings = LimiterSettings(response_headers=headers)
    return (
        RateLimiter(lambda: snapshot, MemoryBackend(), clock, settings, recorder),
        clock,
        recorder,
    )


def decide(
    limiter: RateLimiter, tenant: str, limit: LimitOverride | None = None
) -> DescriptorStatus:
    request = RateLimitRequest("d", (Descriptor((("tenant", tenant),), limit),))
    return asyncio.run(limiter.should_rate_limit(request)).statuses[0]


def codes(limiter: RateLimiter, tenant: str, n: int) -> list[Code]:
    return [decide(limiter, tenant).code for _ in range(n)]


def test_an_override_has_its_own_limit_and_counter() -> None:
    rl, _, _ = limiter(
        """
        overrides:
          - descriptor: tenant=acme
            rate_limit: {unit: minute, requests_per_unit: 4}
        """
    )
    assert codes(rl, "acme", 5) == [Code.OK] * 4 + [Code.OVER_LIMIT]
    assert decide(rl, "acme").current_limit.requests_per_unit == 4  # type: ignore[union-attr]
    assert codes(rl, "other", 3) == [Code.OK, Code.OK, Code.OVER_LIMIT]


def test_an_override_below_the_rule_and_with_another_algorithm() -> None:
    rl, clock, _ = limiter(
        """
        overrides:
          - descriptor: tenant=acme
            rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket, burst: 1}
        """
    )
    assert codes(rl, "acme", 2) == [Code.OK, Code.OVER_LIMIT]
    clock.advance(60)  # the rule's window would have reset; the override's bucket has not
    assert decide(rl, "acme").code is Code.OVER_LIMIT


def test_an_expired_override_falls_back_to_the_rule_and_its_counter() -> None:
    rl, clock, _ = limiter(
        """
        overrides:
          - descriptor: tenant=acme
            rate_limit: {unit: minute, requests_per_unit: 100}
            expires_at: 2027-01-15T08:00:30Z
        """
    )
    assert codes(rl, "acme", 10) == [Code.OK] * 10
    clock.advance(29.999)
    assert decide(rl, "acme").current_limit.requests_per_unit == 100  # type: ignore[union-attr]
    clock.advance(0.001)
    # The rule's counter was never touched by the override's hits: 2 more are admitted.
    assert codes(rl, "acme", 3) == [Code.OK, Code.OK, Code.OVER_LIMIT]


def test_the_operators_override_wins_over_the_clients_limit() -> None:
    rl, _, _ = limiter(
        """
        overrides:
          - descriptor: tenant=acme
            rate_limit: {unit: minute, requests_per_unit: 7}
        """
    )
    status = decide(rl, "acme", LimitOverride(1, Unit.SECOND))
    assert status.current_limit is not None and status.current_limit.requests_per_unit == 7


def test_a_block_refuses_at_once_counts_nothing_and_expires() -> None:
    rl, clock, recorder = limiter(
        """
        blocks:
          - descriptor: tenant=evil
            expires_at: 2027-01-15T08:00:10Z
        """,
        headers=True,
    )
    status = decide(rl, "evil")
    assert status == DescriptorStatus(Code.OVER_LIMIT, None, 0, 10.0, reason="blocked")
    request = RateLimitRequest("d", (Descriptor((("tenant", "evil"),)),))
    decision = asyncio.run(rl.should_rate_limit(request))
    assert decision.overall_code is Code.OVER_LIMIT
    assert [(h.key, h.value) for h in decision.response_headers] == []  # no limit to report
    assert recorder.drain()["d.tenant"].counts[BLOCKED] == 2
    clock.advance(10)
    # Nothing was counted while blocked: the whole limit is there.
    assert codes(rl, "evil", 3) == [Code.OK, Code.OK, Code.OVER_LIMIT]
    assert recorder.drain()["d.tenant"].counts[BLOCKED] == 0


def test_a_block_among_other_descriptors_refuses_only_its_own() -> None:
    rl, _, _ = limiter("blocks: [{descriptor: tenant=evil}]")
    request = RateLimitRequest(
        "d", (Descriptor((("tenant", "evil"),)), Descriptor((("tenant", "good"),)))
    )
    decision = asyncio.run(rl.should_rate_limit(request))
    assert [s.code for s in decision.statuses] == [Code.OVER_LIMIT, Code.OK]
    assert [s.reason for s in decision.statuses] == ["blocked", ""]
    assert decide(rl, "evil").duration_until_reset_s == 0  # no expiry: nothing to wait for


def test_an_allow_is_never_limited_until_it_expires() -> None:
    rl, clock, recorder = limiter(
        """
        allows:
          - descriptor: tenant=health
            expires_at: 2027-01-15T08:01:00Z
        """
    )
    statuses = [decide(rl, "health") for _ in range(5)]
    assert {(s.code, s.limit_remaining) for s in statuses} == {(Code.OK, UNLIMITED_REMAINING)}
    assert recorder.drain()["d.tenant"].counts[ALLOWED] == 5
    clock.advance(60)
    assert codes(rl, "health", 3) == [Code.OK, Code.OK, Code.OVER_LIMIT]
    assert recorder.drain()["d.tenant"].counts[OVER_LIMIT] == 1


OVERRIDE = """
overrides:
  - descriptor: tenant=acme
    rate_limit: {unit: minute, requests_per_unit: 1}
"""
RESETS = """
resets:
  - {descriptor: tenant=bob, generation: 1}
  - {descriptor: tenant=acme, generation: 1}
"""


def test_a_reset_starts_the_counters_afresh() -> None:
    [before] = load_text(RULES + OVERRIDE)
    [after] = load_text(RULES + OVERRIDE + RESETS)
    current = [Snapshot([before])]
    rl = RateLimiter(lambda: current[0], MemoryBackend(), ManualClock(T0))
    assert codes(rl, "bob", 3)[-1] is Code.OVER_LIMIT
    assert codes(rl, "acme", 2) == [Code.OK, Code.OVER_LIMIT]
    assert codes(rl, "carol", 3)[-1] is Code.OVER_LIMIT
    current[0] = Snapshot([after])
    assert codes(rl, "bob", 3) == [Code.OK, Code.OK, Code.OVER_LIMIT]
    assert codes(rl, "acme", 2) == [Code.OK, Code.OVER_LIMIT]  # the override's counter too
    assert decide(rl, "carol").code is Code.OVER_LIMIT  # only the descriptor reset
