"""A share of a limit as Envoy's whole-second, whole-token bucket."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.rlqs.assignment import (
    TOLERANCE,
    TokenBucket,
    changed_enough,
    replacing,
    token_bucket,
)


def test_a_whole_rate_per_second_fills_every_second() -> None:
    assert token_bucket(10.0, 10) == TokenBucket(10, 10, 1)


def test_a_fractional_rate_takes_the_shortest_interval_within_tolerance() -> None:
    # 1.5/s: one token a second would lose a third; three every two seconds is exact.
    assert token_bucket(1.5, 3) == TokenBucket(3, 3, 2)
    # 30 a minute: one token every two seconds.
    assert token_bucket(0.5, 30) == TokenBucket(30, 1, 2)


def test_a_tiny_rate_still_gets_a_token_and_never_more_than_its_share() -> None:
    bucket = token_bucket(1 / 3600, 0.2)  # one an hour, a fifth of a token of burst
    assert bucket.max_tokens == 1
    assert bucket.tokens_per_fill >= 1
    assert bucket.rate_per_s <= 1 / 3600


def test_capacity_is_the_share_of_the_burst_whatever_the_fill() -> None:
    # Envoy refills continuously at tokens_per_fill / fill_interval: a fill above the
    # capacity is not lost, so the burst stays the rule's.
    assert token_bucket(100.0, 5) == TokenBucket(5, 100, 1)
    assert token_bucket(17.5, 17.5) == TokenBucket(17, 35, 2)


def test_a_change_of_the_interval_alone_is_made_visible_to_envoy() -> None:
    old = TokenBucket(5, 1, 2)
    assert replacing(old, TokenBucket(5, 1, 3)) == TokenBucket(6, 1, 3)
    assert replacing(old, TokenBucket(4, 1, 3)) == TokenBucket(4, 1, 3)


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive rate"):
        token_bucket(0.0, 1)


@given(st.floats(min_value=1e-6, max_value=1e6), st.floats(min_value=0, max_value=1e6))
def test_never_above_the_share_and_within_tolerance(rate: float, burst: float) -> None:
    bucket = token_bucket(rate, burst)
    assert bucket.fill_interval_s >= 1
    assert bucket.tokens_per_fill >= 1
    assert bucket.max_tokens == max(1, int(burst))
    assert bucket.rate_per_s <= rate * (1 + 1e-9)
    assert bucket.rate_per_s >= rate * (1 - TOLERANCE) - 1e-12


def test_small_changes_are_not_sent_but_decreases_mostly_are() -> None:
    old = TokenBucket(100, 100, 1)
    assert not changed_enough(old, old)
    assert not changed_enough(old, TokenBucket(103, 103, 1))  # +3 %: not worth a refill
    assert changed_enough(old, TokenBucket(106, 106, 1))  # +6 %
    assert not changed_enough(old, TokenBucket(100, 995, 10))  # -0.5 %
    assert changed_enough(old, TokenBucket(98, 98, 1))  # -2 %
