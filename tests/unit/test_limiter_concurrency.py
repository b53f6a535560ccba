"""ShouldRateLimit on a concurrency rule: the leases held now, refused when all are, and no
lease taken by asking."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from sluice.backends.memory import MemoryBackend
from sluice.clock import ManualClock
from sluice.errors import BackendUnavailableError
from sluice.leases import InFlight, LeaseService, MemoryLeaseStore
from sluice.leases.store import CounterKey
from sluice.limiter import LimiterSettings, RateLimiter
from sluice.model import Code, Descriptor, DescriptorStatus, RateLimit, RateLimitRequest, Unit
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text

POLICY = """\
domain: jobs
descriptors:
  - key: tenant
    rate_limit: {name: reports, concurrency: 2, lease_ttl: 10s}
  - key: shadow
    shadow_mode: true
    rate_limit: {concurrency: 1}
  - key: plan
    rate_limit: {unit: minute, requests_per_unit: 5}
"""
ACME = (("tenant", "acme"),)
REPORTED = RateLimit(2, Unit.UNKNOWN, "reports")


def build(
    clock: ManualClock, settings: LimiterSettings = LimiterSettings()
) -> tuple[RateLimiter, LeaseService]:
    snapshot = Snapshot(load_text(POLICY, "p.yaml"))
    store = MemoryLeaseStore()
    limiter = RateLimiter(lambda: snapshot, MemoryBackend(), clock, settings, leases=store)
    return limiter, LeaseService(lambda: snapshot, store, clock)


def ask(limiter: RateLimiter, *descriptors: tuple[tuple[str, str], ...]) -> list[DescriptorStatus]:
    request = RateLimitRequest("jobs", tuple(Descriptor(d) for d in descriptors))
    decision = asyncio.run(limiter.should_rate_limit(request))
    return list(decision.statuses)


def test_reports_the_leases_held_and_refuses_when_all_are_without_taking_one() -> None:
    clock = ManualClock(1000)
    limiter, leases = build(clock)
    for _ in range(3):  # asking takes no lease
        assert ask(limiter, ACME) == [DescriptorStatus(Code.OK, REPORTED, 2)]
    asyncio.run(leases.acquire("jobs", ACME))
    assert ask(limiter, ACME) == [DescriptorStatus(Code.OK, REPORTED, 1)]
    clock.advance(3)
    asyncio.run(leases.acquire("jobs", ACME))
    # Full: refused until the first lease expires, 7 s from now.
    assert ask(limiter, ACME) == [DescriptorStatus(Code.OVER_LIMIT, REPORTED, 0, 7.0)]
    clock.advance(7)
    assert ask(limiter, ACME) == [DescriptorStatus(Code.OK, REPORTED, 1)]


def test_concurrency_rules_sit_beside_rate_rules_in_one_request() -> None:
    clock = ManualClock(1000)
    limiter, leases = build(clock)
    asyncio.run(leases.acquire("jobs", ACME))
    asyncio.run(leases.acquire("jobs", ACME))
    request = RateLimitRequest("jobs", (Descriptor(ACME), Descriptor((("plan", "pro"),))))
    decision = asyncio.run(limiter.should_rate_limit(request))
    assert decision.overall_code is Code.OVER_LIMIT
    assert decision.statuses[0].code is Code.OVER_LIMIT
    assert decision.statuses[1].code is Code.OK and decision.statuses[1].limit_remaining == 4


def test_shadow_mode_reports_a_full_rule_as_ok() -> None:
    clock = ManualClock(1000)
    limiter, leases = build(clock)
    asyncio.run(leases.acquire("jobs", (("shadow", "x"),)))
    [status] = ask(limiter, (("shadow", "x"),))
    assert (status.code, status.limit_remaining) == (Code.OK, 0)


def test_no_ratelimit_headers_describe_a_concurrency_limit() -> None:
    clock = ManualClock(1000)
    limiter, _ = build(clock, LimiterSettings(response_headers=True))
    request = RateLimitRequest("jobs", (Descriptor(ACME),))
    assert asyncio.run(limiter.should_rate_limit(request)).response_headers == ()


class _Down(MemoryLeaseStore):
    async def in_flight(self, keys: Sequence[CounterKey], *, now: float) -> list[InFlight]:
        raise BackendUnavailableError("Redis: down")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("allow", DescriptorStatus(Code.OK)),
        (
            "deny",
            DescriptorStatus(Code.OVER_LIMIT, REPORTED, reason="rate-limit state unavailable"),
        ),
    ],
)
def test_an_unreachable_lease_store_follows_the_failure_mode(
    mode: str, expected: DescriptorStatus
) -> None:
    snapshot = Snapshot(load_text(POLICY, "p.yaml"))
    limiter = RateLimiter(
        lambda: snapshot,
        MemoryBackend(),
        ManualClock(0),
        LimiterSettings(failure_mode=mode),
        leases=_Down(),
    )
    assert ask(limiter, ACME) == [expected]
    assert limiter.backend_errors == 1


def test_an_unreachable_lease_store_raises_in_failure_mode_error() -> None:
    snapshot = Snapshot(load_text(POLICY, "p.yaml"))
    limiter = RateLimiter(lambda: snapshot, MemoryBackend(), ManualClock(0), leases=_Down())
    with pytest.raises(BackendUnavailableError):
        ask(limiter, ACME)
