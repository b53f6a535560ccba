"""envoyproxy/ratelimit's YAML for its newer keys, as its own fixtures use them: each file in
./upstream_yaml loads (with the warnings ``sluice check --strict`` shows) and decides as
upstream's tests expect, on a manual clock."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sluice.backends.memory import MemoryBackend
from sluice.clock import ManualClock
from sluice.limiter import UNLIMITED_REMAINING, LimiterSettings, RateLimiter
from sluice.model import Code, Decision, Descriptor, RateLimit, RateLimitRequest, Rule, Unit
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import dump_policy, load_path, load_text

FIXTURES = Path(__file__).parent / "upstream_yaml"
START = 1_700_000_040.0  # a whole minute


def limiter_for(name: str, settings: LimiterSettings = LimiterSettings()) -> RateLimiter:
    snapshot = Snapshot(load_path(FIXTURES / name))
    return RateLimiter(lambda: snapshot, MemoryBackend(), ManualClock(START), settings)


def ask(limiter: RateLimiter, domain: str, *descriptors: tuple[str, str]) -> Decision:
    request = RateLimitRequest(domain, tuple(Descriptor((entry,)) for entry in descriptors))
    return asyncio.run(limiter.should_rate_limit(request))


def codes(decision: Decision) -> tuple[Code, list[Code]]:
    return decision.overall_code, [s.code for s in decision.statuses]


OK, OVER = Code.OK, Code.OVER_LIMIT


# --- quota_mode ---------------------------------------------------------------------------


# Each expectation below is what the envoyproxy/ratelimit binary (f2fb15770f7f, the one in
# /work/shared/anchors) answered for the same rules and requests.


def test_a_spent_quota_is_ok_while_another_quota_of_the_request_has_room() -> None:
    limiter = limiter_for("quota_mode.yaml")
    a, b = ("backend", "a"), ("backend", "b")
    assert codes(ask(limiter, "quota", a, b)) == (OK, [OK, OK])
    # b (1 a minute) is spent, a (2 a minute) is not: the request is OK, and b's own status
    # still says OVER_LIMIT (upstream leaves it: a client can see which quota is spent).
    second = ask(limiter, "quota", a, b)
    assert codes(second) == (OK, [OK, OVER])
    assert second.statuses[1].limit_remaining == 0
    assert second.statuses[1].current_limit == RateLimit(1, Unit.MINUTE)
    # Both spent: every quota-mode descriptor is over, so the request is refused.
    assert codes(ask(limiter, "quota", a, b)) == (OVER, [OVER, OVER])


def test_a_request_with_one_quota_is_refused_when_that_quota_is_spent() -> None:
    limiter = limiter_for("quota_mode.yaml")
    b = ("backend", "b")
    assert codes(ask(limiter, "quota", b)) == (OK, [OK])
    assert codes(ask(limiter, "quota", b)) == (OVER, [OVER])


def test_an_ordinary_limit_over_refuses_the_request_whatever_the_quotas_say() -> None:
    limiter = limiter_for("quota_mode.yaml")
    a, b, user = ("backend", "a"), ("backend", "b"), ("user", "u1")
    assert codes(ask(limiter, "quota", a, b, user)) == (OK, [OK, OK, OK])
    # user is over (an ordinary limit): refused; b is over too, a still has room.
    assert codes(ask(limiter, "quota", a, b, user)) == (OVER, [OK, OVER, OVER])


def test_quotas_all_spent_under_global_shadow_mode_answer_ok_overall() -> None:
    limiter = limiter_for("quota_mode.yaml", LimiterSettings(global_shadow_mode=True))
    b = ("backend", "b")
    ask(limiter, "quota", b)
    assert codes(ask(limiter, "quota", b)) == (OK, [OVER])


# --- middle wildcards ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "limit"),
    [
        ("/api/v1/users", 1),
        ("/api/v2/beta/users", 1),
        ("foo-bar-baz", 2),
        ("foobarbaz", 2),
        ("/static/css/site.css", 3),
    ],
)
def test_a_star_anywhere_in_a_value_is_a_wildcard(value: str, limit: int) -> None:
    limiter = limiter_for("wildcard_middle.yaml")
    for n in range(limit):
        decision = ask(limiter, "wildcard", ("path", value))
        assert codes(decision) == (OK, [OK])
        assert decision.statuses[0].limit_remaining == limit - n - 1
    assert codes(ask(limiter, "wildcard", ("path", value))) == (OVER, [OVER])


@pytest.mark.parametrize("value", ["/api/v1/items", "/api/users", "foobar", "bazfoobar"])
def test_a_value_the_wildcards_do_not_match_has_no_limit(value: str) -> None:
    decision = ask(limiter_for("wildcard_middle.yaml"), "wildcard", ("path", value))
    assert codes(decision) == (OK, [OK])
    assert decision.statuses[0].current_limit is None


# --- the other newer keys -----------------------------------------------------------------


def test_the_newer_keys_load_with_upstreams_meaning_and_strict_warnings() -> None:
    warnings: list[str] = []
    [policy] = load_path(FIXTURES / "newer_keys.yaml", warnings=warnings)
    route, tenant, blocked, ldap = policy.descriptors
    assert route.value_to_metric and route.descriptors[0].value_to_metric
    user_id = route.descriptors[0].descriptors[0]
    assert user_id.detailed_metric and not user_id.value_to_metric
    assert tenant.quota_mode
    assert tenant.metadata is not None
    assert json.loads(tenant.metadata) == {"backend": "primary", "weight": 3}
    # No requests_per_unit: 0, as upstream reads it.
    assert blocked.limits == (RateLimit(0, Unit.SECOND),)
    assert ldap.unlimited and ldap.replaces == ("nowhere",)
    path = FIXTURES / "newer_keys.yaml"
    assert warnings == [
        f"{path}:17: 'metadata' is kept but not sent: Sluice sends no dynamic metadata",
        f"{path}:26: rate_limit has no 'requests_per_unit': read as 0, as upstream reads it, "
        f"so nothing is admitted",
        f"{path}:28: 'unit' has no meaning in a descriptor: ignored, as upstream ignores it",
        f"{path}:27: replaces 'nowhere', but no rate_limit in domain 'newer' has that name "
        f"(nothing is replaced)",
    ]


def test_a_rule_without_requests_per_unit_admits_nothing() -> None:
    decision = ask(limiter_for("newer_keys.yaml"), "newer", ("blocked", "x"))
    assert codes(decision) == (OVER, [OVER])
    assert decision.statuses[0].current_limit == RateLimit(0, Unit.SECOND)


def test_an_unlimited_rule_replacing_an_unknown_name_stays_unlimited() -> None:
    decision = ask(limiter_for("newer_keys.yaml"), "newer", ("ldap", "x"))
    assert codes(decision) == (OK, [OK])
    assert decision.statuses[0].limit_remaining == UNLIMITED_REMAINING


def test_the_newer_keys_round_trip_through_the_canonical_dump() -> None:
    [policy] = load_path(FIXTURES / "newer_keys.yaml")
    assert load_text(dump_policy(policy)) == [policy]
    assert "value_to_metric: true" in dump_policy(policy)
    assert "quota_mode: true" in dump_policy(policy)


def test_value_to_metric_and_detailed_metric_never_change_a_decision() -> None:
    plain = load_text(
        "domain: m\ndescriptors:\n  - key: k\n"
        "    rate_limit: {unit: minute, requests_per_unit: 1}\n"
    )
    flagged = load_text(
        "domain: m\ndescriptors:\n  - key: k\n"
        "    value_to_metric: true\n    detailed_metric: true\n"
        "    rate_limit: {unit: minute, requests_per_unit: 1}\n"
    )
    answers = []
    for policies in (plain, flagged):
        snapshot = Snapshot(policies)
        limiter = RateLimiter(lambda s=snapshot: s, MemoryBackend(), ManualClock(START))
        answers.append([codes(ask(limiter, "m", ("k", "v"))) for _ in range(2)])
    assert answers[0] == answers[1] == [(OK, [OK]), (OVER, [OVER])]
    assert flagged[0].descriptors[0] == Rule(
        "k", limits=(RateLimit(1, Unit.MINUTE),), detailed_metric=True, value_to_metric=True
    )


def test_an_unlimited_rule_with_quota_mode_is_no_quota_so_a_spent_one_refuses() -> None:
    # Upstream checks no limit for an unlimited rule, so it is not among the quotas that
    # must all be spent: b, the only quota checked, is, and the request is refused.
    limiter = limiter_for("quota_mode.yaml")
    b, free = ("backend", "b"), ("free_backend", "x")
    assert codes(ask(limiter, "quota", b, free)) == (OK, [OK, OK])
    decision = ask(limiter, "quota", b, free)
    assert codes(decision) == (OVER, [OVER, OK])
    assert decision.statuses[1].limit_remaining == UNLIMITED_REMAINING


def test_a_shadow_mode_quota_is_never_spent_so_the_others_answer_ok() -> None:
    policy = """\
domain: quota
descriptors:
  - {key: backend, value: a, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - key: shadow
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"""
    snapshot = Snapshot(load_text(policy))
    limiter = RateLimiter(lambda: snapshot, MemoryBackend(), ManualClock(START))
    a, shadow = ("backend", "a"), ("shadow", "s")
    assert codes(ask(limiter, "quota", a, shadow)) == (OK, [OK, OK])
    # Both over their limits; the shadow one reports OK, so not every quota is spent.
    assert codes(ask(limiter, "quota", a, shadow)) == (OK, [OVER, OK])
    # A quota-mode rule alone over its limit, no other quota: refused.
    assert codes(ask(limiter, "quota", a, ("user", "u"))) == (OVER, [OVER, OK])
