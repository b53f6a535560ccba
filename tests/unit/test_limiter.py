"""ShouldRateLimit decisions end to end in domain code, on a manual clock."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from sluice.backends.memory import MemoryBackend
from sluice.clock import ManualClock
from sluice.errors import BackendUnavailableError, InvalidRequestError
from sluice.limiter import UNLIMITED_REMAINING, LimiterSettings, RateLimiter
from sluice.model import (
    Code,
    Decision,
    Descriptor,
    DescriptorStatus,
    Header,
    LimitOverride,
    RateLimit,
    RateLimitRequest,
    Unit,
)
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text

POLICY = textwrap.dedent(
    """
    domain: d
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: shadow
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
      - key: free
        rate_limit: {unlimited: true}
      - key: internal
        rate_limit:
          unlimited: true
          replaces: [{name: specific_limit}]
      - key: key_1
        value: value_1
        descriptors:
          - key: user
            value: bkthomps
            rate_limit: {name: specific_limit, unit: second, requests_per_unit: 5}
      - key: key_2
        value: value_2
        descriptors:
          - key: user
            value: bkthomps
            rate_limit:
              replaces: [{name: specific_limit}]
              unit: second
              requests_per_unit: 10
    """
)

START = 1_700_000_000.0  # a whole minute: 1_700_000_000 % 60 == 20, so 40 s remain in it


def make(settings: LimiterSettings = LimiterSettings()) -> tuple[RateLimiter, ManualClock]:
    clock = ManualClock(START)
    snapshot = Snapshot(load_text(POLICY, "t.yaml"))
    return RateLimiter(lambda: snapshot, MemoryBackend(), clock, settings), clock


def ask(
    limiter: RateLimiter, *descriptors: Descriptor, hits: int = 0, domain: str = "d"
) -> Decision:
    return asyncio.run(limiter.should_rate_limit(RateLimitRequest(domain, descriptors, hits)))


def d(*entries: tuple[str, str], **kwargs: object) -> Descriptor:
    return Descriptor(tuple(entries), **kwargs)  # type: ignore[arg-type]


PER_MINUTE_3 = RateLimit(3, Unit.MINUTE)


def test_counts_up_to_the_limit_then_refuses_and_keeps_counting() -> None:
    limiter, clock = make()
    remaining = [ask(limiter, d(("user", "a"))).statuses[0].limit_remaining for _ in range(3)]
    assert remaining == [2, 1, 0]
    over = ask(limiter, d(("user", "a")))
    assert over == Decision(
        Code.OVER_LIMIT, (DescriptorStatus(Code.OVER_LIMIT, PER_MINUTE_3, 0, 40),)
    )
    clock.advance(40)  # the next epoch-aligned window
    assert ask(limiter, d(("user", "a"))).statuses[0] == DescriptorStatus(
        Code.OK, PER_MINUTE_3, 2, 60
    )


def test_no_rule_unknown_domain_and_unlimited() -> None:
    limiter, _ = make()
    assert ask(limiter, d(("nothing", "x"))) == Decision(Code.OK, (DescriptorStatus(Code.OK),))
    assert ask(limiter, d(("user", "a")), domain="nope") == Decision(
        Code.OK, (DescriptorStatus(Code.OK),)
    )
    for _ in range(5):
        assert ask(limiter, d(("free", "x"))).statuses[0] == DescriptorStatus(
            Code.OK, None, UNLIMITED_REMAINING, 0
        )


def test_statuses_follow_request_order_and_any_over_limit_wins() -> None:
    limiter, _ = make()
    ask(limiter, d(("user", "a")), hits=3)
    decision = ask(limiter, d(("nothing", "x")), d(("user", "a")), d(("user", "b")))
    assert decision.overall_code is Code.OVER_LIMIT
    assert [s.code for s in decision.statuses] == [Code.OK, Code.OVER_LIMIT, Code.OK]
    assert decision.statuses[2].limit_remaining == 2


def test_request_hits_addend_zero_means_one() -> None:
    limiter, _ = make()
    assert ask(limiter, d(("user", "a")), hits=0).statuses[0].limit_remaining == 2
    assert ask(limiter, d(("user", "a")), hits=2).statuses[0].limit_remaining == 0


def test_descriptor_hits_addend_wins_and_zero_checks_without_consuming() -> None:
    limiter, _ = make()
    assert ask(limiter, d(("user", "a"), hits_addend=2), hits=1).statuses[0].limit_remaining == 1
    for _ in range(3):
        assert (
            ask(limiter, d(("user", "a"), hits_addend=0), hits=5).statuses[0].limit_remaining == 1
        )
    assert ask(limiter, d(("user", "a"), hits_addend=2)).overall_code is Code.OVER_LIMIT


def test_shadow_mode_reports_ok_with_nothing_remaining() -> None:
    limiter, _ = make()
    ask(limiter, d(("shadow", "x")))
    decision = ask(limiter, d(("shadow", "x")))
    assert decision == Decision(
        Code.OK, (DescriptorStatus(Code.OK, RateLimit(1, Unit.MINUTE), 0, 40),)
    )


def test_global_shadow_mode_answers_ok_but_keeps_statuses() -> None:
    limiter, _ = make(LimiterSettings(global_shadow_mode=True))
    decision = ask(limiter, d(("user", "a")), hits=4)
    assert decision.overall_code is Code.OK
    assert decision.statuses[0].code is Code.OVER_LIMIT
    assert limiter.global_shadow_answers == 1  # upstream's global_shadow_mode counter
    ask(limiter, d(("nothing", "x")))
    assert limiter.global_shadow_answers == 1  # nothing was over: not counted


def test_limit_override_replaces_the_configured_limit() -> None:
    limiter, _ = make()
    override = LimitOverride(1, Unit.HOUR)
    first = ask(limiter, d(("user", "a"), limit=override))
    reset_s = 3600 - int(START) % 3600
    assert first.statuses[0] == DescriptorStatus(Code.OK, RateLimit(1, Unit.HOUR), 0, reset_s)
    assert ask(limiter, d(("user", "a"), limit=override)).overall_code is Code.OVER_LIMIT
    # Envoy's override is ignored for a domain Sluice does not know.
    assert ask(limiter, d(("user", "a"), limit=override), domain="nope").overall_code is Code.OK


RAISED = LimitOverride(1_000_000, Unit.MINUTE)  # a client raising its own limit


def test_ignored_overrides_leave_the_rule_deciding() -> None:
    limiter, _ = make(LimiterSettings(limit_overrides="ignore"))
    remaining = [
        ask(limiter, d(("user", "bob"), limit=RAISED)).statuses[0].limit_remaining for _ in range(3)
    ]
    assert remaining == [2, 1, 0]
    over = ask(limiter, d(("user", "bob"), limit=RAISED))
    assert over.statuses[0] == DescriptorStatus(Code.OVER_LIMIT, PER_MINUTE_3, 0, 40)


def test_denied_overrides_are_invalid_and_count_nothing() -> None:
    limiter, _ = make(LimiterSettings(limit_overrides="deny"))
    with pytest.raises(InvalidRequestError) as info:
        ask(limiter, d(("user", "bob")), d(("user", "bob"), limit=RAISED))
    assert str(info.value) == (
        "descriptors[1].limit: domain 'd' does not accept limit overrides from clients"
    )
    # The refused request counted nothing, not even its first descriptor.
    assert ask(limiter, d(("user", "bob"))).statuses[0].limit_remaining == 2


@pytest.mark.parametrize(
    ("server", "domain", "expected_remaining"),
    [
        pytest.param("allow", "ignore", 2, id="the-domain-ignores-on-an-allowing-server"),
        pytest.param("ignore", "allow", 999_999, id="the-domain-allows-on-an-ignoring-server"),
        pytest.param("deny", "allow", 999_999, id="the-domain-allows-on-a-denying-server"),
    ],
)
def test_a_domain_setting_wins_over_the_server(
    server: str, domain: str, expected_remaining: int
) -> None:
    snapshot = Snapshot(load_text(f"limit_overrides: {domain}\n" + POLICY, "t.yaml"))
    limiter = RateLimiter(
        lambda: snapshot,
        MemoryBackend(),
        ManualClock(START),
        LimiterSettings(limit_overrides=server),
    )
    status = ask(limiter, d(("user", "bob"), limit=RAISED)).statuses[0]
    assert status.limit_remaining == expected_remaining


def test_replaces_drops_the_named_limit_without_consuming_it() -> None:
    limiter, _ = make()
    both = ask(
        limiter,
        d(("key_1", "value_1"), ("user", "bkthomps")),
        d(("key_2", "value_2"), ("user", "bkthomps")),
    )
    assert both.statuses[0] == DescriptorStatus(Code.OK)
    assert both.statuses[1].current_limit == RateLimit(10, Unit.SECOND)
    assert both.statuses[1].limit_remaining == 9
    alone = ask(limiter, d(("key_1", "value_1"), ("user", "bkthomps")))
    assert alone.statuses[0] == DescriptorStatus(
        Code.OK, RateLimit(5, Unit.SECOND, "specific_limit"), 4, 1
    )


def test_response_headers_describe_the_limit_closest_to_exhaustion() -> None:
    limiter, _ = make(LimiterSettings(response_headers=True))
    ok = ask(limiter, d(("user", "a")), d(("user", "b")), hits=1)
    assert ok.response_headers == (
        Header("RateLimit-Policy", '"default";q=3;w=60'),
        Header("RateLimit", '"default";r=2;t=40'),
    )
    over = ask(limiter, d(("user", "a")), hits=3)
    assert over.response_headers == (
        Header("RateLimit-Policy", '"default";q=3;w=60'),
        Header("RateLimit", '"default";r=0;t=40'),
        Header("Retry-After", "40"),
    )
    assert ask(limiter, d(("nothing", "x"))).response_headers == ()


def test_headers_are_off_by_default() -> None:
    limiter, _ = make()
    assert ask(limiter, d(("user", "a"))).response_headers == ()


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (RateLimitRequest("", (d(("k", "v")),)), "domain: must not be empty"),
        (RateLimitRequest("d", ()), "descriptors: must not be empty"),
        (RateLimitRequest("d", (d(("k", "v")), d())), "descriptors[1].entries: must not be empty"),
        (
            RateLimitRequest("d", (d(("k", "v"), ("", "v")),)),
            "descriptors[0].entries[1].key: must not be empty",
        ),
        (
            RateLimitRequest("d", (d(("k", "v"), limit=LimitOverride(1, Unit.UNKNOWN)),)),
            "descriptors[0].limit.unit: must be one of "
            "SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR",
        ),
        (
            RateLimitRequest("d" * 257, (d(("k", "v")),)),
            "domain: 257 characters, more than the maximum of 256",
        ),
        (
            RateLimitRequest("d", tuple(d(("k", "v")) for _ in range(65))),
            "descriptors: 65 descriptors, more than the maximum of 64",
        ),
        (
            RateLimitRequest("d", (d(*[("k", "v")] * 17),)),
            "descriptors[0].entries: 17 entries, more than the maximum of 16",
        ),
        (
            RateLimitRequest("d", (d(("k" * 257, "v")),)),
            "descriptors[0].entries[0].key: 257 characters, more than the maximum of 256",
        ),
        (
            RateLimitRequest("d", (d(("k", "v" * 1025)),)),
            "descriptors[0].entries[0].value: 1025 characters, more than the maximum of 1024",
        ),
    ],
)
def test_bad_requests_name_the_field(request_: RateLimitRequest, message: str) -> None:
    limiter, _ = make()
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(limiter.should_rate_limit(request_))
    assert str(info.value) == message


def test_an_unlimited_rule_still_replaces() -> None:
    limiter, _ = make()
    decision = ask(limiter, d(("key_1", "value_1"), ("user", "bkthomps")), d(("internal", "x")))
    assert decision.statuses == (
        DescriptorStatus(Code.OK),
        DescriptorStatus(Code.OK, None, UNLIMITED_REMAINING, 0),
    )


class UnavailableBackend:
    """A backend whose state store is down: what the failure modes are about."""

    async def apply(self, hits, now):  # noqa: ANN001, ANN201
        raise BackendUnavailableError("redis: connection refused")

    async def close(self) -> None:
        pass


def failing(mode: str) -> RateLimiter:
    snapshot = Snapshot(load_text(POLICY, "t.yaml"))
    return RateLimiter(
        lambda: snapshot,
        UnavailableBackend(),
        ManualClock(START),
        LimiterSettings(failure_mode=mode),
    )


def test_failure_mode_allow_answers_ok_without_a_limit() -> None:
    limiter = failing("allow")
    decision = ask(limiter, d(("user", "a")), d(("free", "x")))
    assert limiter.backend_errors == 1  # one request, one failed round trip (redis_error)
    assert decision.overall_code is Code.OK
    assert decision.statuses[0] == DescriptorStatus(Code.OK)
    assert decision.statuses[1].limit_remaining == UNLIMITED_REMAINING


def test_failure_mode_deny_refuses_limited_descriptors_only() -> None:
    decision = ask(failing("deny"), d(("user", "a")), d(("nothing", "x")), d(("shadow", "x")))
    assert [s.code for s in decision.statuses] == [Code.OVER_LIMIT, Code.OK, Code.OK]
    assert decision.statuses[0].current_limit == PER_MINUTE_3
    assert decision.statuses[0].reason == "rate-limit state unavailable"


def test_failure_mode_error_raises_and_needs_no_backend_when_nothing_applies() -> None:
    with pytest.raises(BackendUnavailableError):
        ask(failing("error"), d(("user", "a")))
    assert ask(failing("error"), d(("nothing", "x"))).overall_code is Code.OK


def test_unknown_failure_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="failure_mode must be one of"):
        failing("shrug")


MULTI = textwrap.dedent(
    """
    domain: m
    descriptors:
      - key: api
        rate_limit:
          name: api
          limits:
            - {unit: second, requests_per_unit: 2}
            - {unit: minute, requests_per_unit: 3}
    """
)


def test_several_limits_report_the_one_that_decides() -> None:
    snapshot = Snapshot(load_text(MULTI, "m.yaml"))
    clock = ManualClock(START)
    limiter = RateLimiter(lambda: snapshot, MemoryBackend(), clock)
    per_second, per_minute = RateLimit(2, Unit.SECOND, "api"), RateLimit(3, Unit.MINUTE, "api")
    # Both admit: the one closest to exhaustion is reported.
    first = ask(limiter, d(("api", "k")), domain="m").statuses[0]
    assert (first.current_limit, first.limit_remaining) == (per_second, 1)
    second = ask(limiter, d(("api", "k")), domain="m").statuses[0]
    assert (second.current_limit, second.limit_remaining) == (per_second, 0)
    # Per second refuses: it is reported with its (short) wait.
    third = ask(limiter, d(("api", "k")), domain="m").statuses[0]
    assert (third.code, third.current_limit, third.duration_until_reset_s) == (
        Code.OVER_LIMIT,
        per_second,
        1,
    )
    clock.advance(1)
    # Per minute refuses now (fixed windows count refused hits: 4 > 3); the longest wait wins.
    fourth = ask(limiter, d(("api", "k")), domain="m").statuses[0]
    assert (fourth.code, fourth.current_limit, fourth.duration_until_reset_s) == (
        Code.OVER_LIMIT,
        per_minute,
        39,
    )


def test_a_cost_that_can_never_fit_says_why() -> None:
    limiter, _ = make()
    status = ask(limiter, d(("user", "a"), hits_addend=4)).statuses[0]
    assert status.code is Code.OVER_LIMIT
    assert status.reason == "a cost of 4 can never be admitted: the fixed_window capacity is 3"


def test_fixed_windows_report_whole_seconds_like_envoyproxy_ratelimit() -> None:
    limiter, clock = make()
    clock.set(START + 0.25)  # 39.75 s left in the minute: upstream says 40
    assert ask(limiter, d(("user", "a"))).statuses[0].duration_until_reset_s == 40


def test_calendar_windows_count_to_the_next_boundary_in_the_status_and_headers() -> None:
    policy = textwrap.dedent(
        """
        domain: ai
        descriptors:
          - key: tenant
            rate_limit:
              unit: month
              requests_per_unit: 1000
              calendar: true
              timezone: Europe/Paris
        """
    )
    # 2026-10-31 23:00 in Paris (22:00 UTC, an hour after the clocks went back): an hour and
    # a bit of October left, though the epoch-aligned 30-day window would run for days.
    november = 1_793_487_600  # 2026-11-01 00:00 in Paris
    clock = ManualClock(november - 3600.5)
    snapshot = Snapshot(load_text(policy, "t.yaml"))
    limiter = RateLimiter(
        lambda: snapshot, MemoryBackend(), clock, LimiterSettings(response_headers=True)
    )
    limit = snapshot.policies[0].descriptors[0].limits[0]
    full = ask(limiter, d(("tenant", "acme")), hits=1000, domain="ai")
    assert full.statuses[0] == DescriptorStatus(Code.OK, limit, 0, 3601)
    over = ask(limiter, d(("tenant", "acme")), hits=1, domain="ai")
    assert over.statuses[0] == DescriptorStatus(Code.OVER_LIMIT, limit, 0, 3601)
    assert over.response_headers == (
        Header("RateLimit-Policy", '"default";q=1000;w=2592000'),
        Header("RateLimit", '"default";r=0;t=3601'),
        Header("Retry-After", "3601"),
    )
    clock.advance(3600.5)  # November: a new window
    ok = ask(limiter, d(("tenant", "acme")), hits=1000, domain="ai")
    assert ok.statuses[0].code is Code.OK
    assert ok.statuses[0].duration_until_reset_s == 30 * 86400  # November's own length
