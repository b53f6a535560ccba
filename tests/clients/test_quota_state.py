"""The quota's state (_quota.py): what is decided, reported and held, with the time passed
in as plain numbers."""

from __future__ import annotations

import pytest

from sluice_client import InvalidRequest, QuotaDecision
from sluice_client._quota import (
    IDLE_REPORTS,
    Action,
    QuotaState,
    Usage,
    bucket_key,
    reconnect_delay_s,
)
from sluice_client._token_bucket import TokenBucketSpec

ACME = {"tenant": "acme"}
ACME_KEY = (("tenant", "acme"),)
BETA_KEY = (("tenant", "beta"),)
TWO_PER_S = TokenBucketSpec(max_tokens=2, tokens_per_fill=2, fill_interval_s=1.0)


def state(now_s: float = 0.0) -> QuotaState:
    return QuotaState(report_interval_s=5.0, now_s=now_s)


def test_a_new_bucket_falls_back_and_is_reported_at_once() -> None:
    quota = state()
    decision, new = quota.decide(ACME, 1, now_s=0.5, fallback=True)
    assert decision == QuotaDecision(allowed=True, degraded=True) and new
    assert quota.due_in_s(0.5) == 0
    assert quota.take_report(0.5) == [Usage(ACME_KEY, allowed=1, denied=0, elapsed_s=0.0)]
    assert quota.due_in_s(0.5) == pytest.approx(4.5)  # the next periodic report
    decision, new = quota.decide(ACME, 1, now_s=0.6, fallback=True)
    assert not new


@pytest.mark.parametrize(
    ("fallback", "expected"),
    [(True, QuotaDecision(True, degraded=True)), (False, QuotaDecision(False, degraded=True))],
)
def test_the_fallback_decides_without_an_assignment(
    fallback: bool, expected: QuotaDecision
) -> None:
    decision, _ = state().decide(ACME, 1, now_s=0.0, fallback=fallback)
    assert decision == expected and bool(decision) is fallback


def test_no_fallback_means_no_decision_and_nothing_counted() -> None:
    quota = state()
    assert quota.decide(ACME, 1, now_s=0.0, fallback=None) == (None, True)
    assert quota.take_report(0.0) == [Usage(ACME_KEY, 0, 0, 0.0)]


def test_the_key_order_of_a_bucket_does_not_matter() -> None:
    quota = state()
    quota.decide({"a": "1", "b": "2"}, 1, now_s=0.0, fallback=True)
    _, new = quota.decide({"b": "2", "a": "1"}, 1, now_s=0.0, fallback=True)
    assert not new and len(quota) == 1


def test_a_token_bucket_assignment_admits_its_burst_and_refills() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=True)
    quota.apply([Action(ACME_KEY, TWO_PER_S, ttl_s=15.0)], now_s=0.0)
    decisions = [quota.decide(ACME, 1, now_s=0.1, fallback=True)[0] for _ in range(3)]
    assert decisions == [QuotaDecision(True), QuotaDecision(True), QuotaDecision(False)]
    assert quota.decide(ACME, 1, now_s=0.6, fallback=True)[0] == QuotaDecision(True)


def test_cost_takes_that_many_tokens_and_counts_that_many() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=True)
    quota.take_report(0.0)
    quota.apply([Action(ACME_KEY, TWO_PER_S, ttl_s=15.0)], now_s=0.0)
    assert quota.decide(ACME, 2, now_s=0.0, fallback=True)[0] == QuotaDecision(True)
    assert quota.decide(ACME, 2, now_s=0.0, fallback=True)[0] == QuotaDecision(False)
    assert quota.take_report(5.0) == [Usage(ACME_KEY, allowed=2, denied=2, elapsed_s=5.0)]


@pytest.mark.parametrize(("strategy", "allowed"), [("allow_all", True), ("deny_all", False)])
def test_blanket_rules(strategy: str, allowed: bool) -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=not allowed)
    quota.apply([Action(ACME_KEY, strategy, ttl_s=15.0)], now_s=0.0)  # type: ignore[arg-type]
    for _ in range(100):
        assert quota.decide(ACME, 1, now_s=1.0, fallback=not allowed)[0] == QuotaDecision(allowed)


def test_an_assignment_expires_after_its_time_to_live() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=False)
    quota.apply([Action(ACME_KEY, "allow_all", ttl_s=15.0)], now_s=1.0)
    assert quota.decide(ACME, 1, now_s=15.99, fallback=False)[0] == QuotaDecision(True)
    assert quota.held_strategy(ACME, now_s=15.99) == "allow_all"
    assert quota.decide(ACME, 1, now_s=16.0, fallback=False)[0] == QuotaDecision(
        False, degraded=True
    )
    assert quota.held_strategy(ACME, now_s=16.0) is None


def test_a_refreshed_token_bucket_keeps_its_tokens() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=True)
    quota.apply([Action(ACME_KEY, TWO_PER_S, ttl_s=15.0)], now_s=0.0)
    assert quota.decide(ACME, 2, now_s=0.0, fallback=True)[0] == QuotaDecision(True)
    # The same assignment again (as every report's answer brings): no fresh burst.
    quota.apply([Action(ACME_KEY, TWO_PER_S, ttl_s=15.0)], now_s=0.0)
    assert quota.decide(ACME, 1, now_s=0.0, fallback=True)[0] == QuotaDecision(False)


def test_a_token_bucket_after_a_lapse_or_a_blanket_rule_starts_full() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=True)
    quota.apply([Action(ACME_KEY, TWO_PER_S, ttl_s=1.0)], now_s=0.0)
    assert quota.decide(ACME, 2, now_s=0.0, fallback=True)[0] == QuotaDecision(True)
    quota.apply([Action(ACME_KEY, TWO_PER_S, ttl_s=1.0)], now_s=1.0)  # the first lapsed
    assert quota.decide(ACME, 2, now_s=1.0, fallback=True)[0] == QuotaDecision(True)
    quota.apply([Action(ACME_KEY, "deny_all", ttl_s=15.0)], now_s=1.0)
    quota.apply([Action(ACME_KEY, TWO_PER_S, ttl_s=15.0)], now_s=1.0)
    assert quota.decide(ACME, 2, now_s=1.0, fallback=True)[0] == QuotaDecision(True)


def test_abandon_forgets_the_bucket_and_its_counts() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=True)
    quota.take_report(0.0)
    quota.apply([Action(ACME_KEY, "allow_all", ttl_s=15.0)], now_s=0.0)
    quota.decide(ACME, 1, now_s=1.0, fallback=True)
    quota.apply([Action(ACME_KEY, None)], now_s=1.0)
    assert len(quota) == 0
    decision, new = quota.decide(ACME, 1, now_s=2.0, fallback=False)
    assert new and decision == QuotaDecision(False, degraded=True)
    assert quota.take_report(2.0) == [Usage(ACME_KEY, 0, 1, 0.0)]


def test_actions_for_unknown_buckets_are_ignored() -> None:
    quota = state()
    quota.apply([Action(BETA_KEY, "deny_all", ttl_s=15.0), Action(BETA_KEY, None)], now_s=0.0)
    assert len(quota) == 0


def test_every_interval_reports_every_bucket_with_its_counts_and_elapsed_time() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=1.0, fallback=True)
    assert quota.take_report(1.0) == [Usage(ACME_KEY, 1, 0, 0.0)]
    quota.decide({"tenant": "beta"}, 1, now_s=2.0, fallback=False)
    assert quota.take_report(2.0) == [Usage(BETA_KEY, 0, 1, 0.0)]  # only the new one
    quota.decide(ACME, 3, now_s=4.0, fallback=True)
    assert quota.due_in_s(4.0) == pytest.approx(1.0)
    report = sorted(quota.take_report(5.0), key=lambda u: u.bucket)
    assert report == [Usage(ACME_KEY, 3, 0, 4.0), Usage(BETA_KEY, 0, 0, 3.0)]
    assert quota.due_in_s(5.0) == pytest.approx(5.0)


def test_a_new_stream_reports_every_bucket_at_once() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=True)
    quota.take_report(0.0)
    assert quota.due_in_s(1.0) > 0
    quota.stream_started()
    assert quota.due_in_s(1.0) == 0
    assert quota.take_report(1.0) == [Usage(ACME_KEY, 0, 0, 1.0)]


def test_a_lost_stream_keeps_assignments_with_a_time_to_live_only() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=False)
    quota.decide({"tenant": "beta"}, 1, now_s=0.0, fallback=False)
    quota.apply(
        [Action(ACME_KEY, "allow_all", ttl_s=15.0), Action(BETA_KEY, "allow_all", ttl_s=None)],
        now_s=0.0,
    )
    assert quota.held_strategy({"tenant": "beta"}, now_s=100.0) == "allow_all"
    quota.stream_lost()
    assert quota.held_strategy(ACME, now_s=1.0) == "allow_all"
    assert quota.held_strategy({"tenant": "beta"}, now_s=1.0) is None


def test_a_bucket_unused_for_idle_reports_intervals_is_forgotten() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=True)
    quota.take_report(0.0)
    now = 0.0
    for _ in range(IDLE_REPORTS):
        now += 5.0
        assert [u.bucket for u in quota.take_report(now)] == [ACME_KEY]
    now += 5.0
    assert quota.take_report(now) == [] and len(quota) == 0


@pytest.mark.parametrize(
    ("bucket", "message"),
    [
        ([("tenant", "acme")], "bucket: must be a mapping"),
        ({}, "bucket: must have at least one entry"),
        ({"": "x"}, "bucket: keys must be non-empty strings"),
        ({1: "x"}, "bucket: keys must be non-empty strings"),
        ({"tenant": 1}, r"bucket\['tenant'\]: must be a string"),
    ],
)
def test_a_malformed_bucket_is_refused_naming_the_field(bucket: object, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        state().decide(bucket, 1, now_s=0.0, fallback=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match=message):
        bucket_key(bucket)  # type: ignore[arg-type]


def test_reconnect_delay_doubles_up_to_five_seconds_with_jitter() -> None:
    assert [reconnect_delay_s(n, jitter=0.999999) for n in range(8)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0], rel=1e-5
    )
    assert reconnect_delay_s(0, jitter=0.0) == pytest.approx(0.05)
    assert reconnect_delay_s(10_000, jitter=0.0) == pytest.approx(2.5)


def test_dropped_assignments_fall_back_at_once() -> None:
    quota = state()
    quota.decide(ACME, 1, now_s=0.0, fallback=False)
    quota.apply([Action(ACME_KEY, "allow_all", ttl_s=15.0)], now_s=0.0)
    quota.drop_assignments()
    assert quota.decide(ACME, 1, now_s=1.0, fallback=False)[0] == QuotaDecision(
        False, degraded=True
    )
