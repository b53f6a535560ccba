"""The in-process token bucket of a quota assignment, with the time passed in."""

from __future__ import annotations

import pytest

from sluice_client._token_bucket import TokenBucket, TokenBucketSpec

# 10 tokens at most, 5 more every 2 s: 2.5 tokens per second.
SPEC = TokenBucketSpec(max_tokens=10, tokens_per_fill=5, fill_interval_s=2.0)


def test_starts_full_and_admits_the_burst_then_refuses() -> None:
    bucket = TokenBucket(SPEC, now_s=100.0)
    assert [bucket.take(1, now_s=100.0) for _ in range(11)] == [True] * 10 + [False]


def test_refills_at_tokens_per_fill_over_fill_interval() -> None:
    bucket = TokenBucket(SPEC, now_s=0.0)
    assert bucket.take(10, now_s=0.0)
    assert not bucket.take(5, now_s=1.9)  # 4.75 tokens
    assert bucket.take(5, now_s=2.0)  # 5 tokens: one fill interval
    assert not bucket.take(1, now_s=2.0)


def test_fractional_time_refills_fractional_tokens() -> None:
    bucket = TokenBucket(SPEC, now_s=0.0)
    assert bucket.take(10, now_s=0.0)
    assert not bucket.take(1, now_s=0.39)  # 0.975 tokens
    assert bucket.take(1, now_s=0.4)  # 1 token
    assert bucket.tokens == pytest.approx(0.0)
    assert not bucket.take(1, now_s=0.5)  # 0.25 tokens
    assert bucket.tokens == pytest.approx(0.25)


def test_never_holds_more_than_max_tokens() -> None:
    bucket = TokenBucket(SPEC, now_s=0.0)
    assert bucket.take(3, now_s=0.0)
    assert bucket.tokens == 7
    bucket.take(0, now_s=1_000.0)
    assert bucket.tokens == 10


def test_a_cost_above_max_tokens_is_never_admitted_and_takes_nothing() -> None:
    bucket = TokenBucket(SPEC, now_s=0.0)
    assert not bucket.take(11, now_s=1_000.0)
    assert bucket.tokens == 10


def test_a_clock_read_out_of_order_neither_refills_nor_rewinds() -> None:
    bucket = TokenBucket(SPEC, now_s=10.0)
    assert bucket.take(10, now_s=10.0)
    assert not bucket.take(1, now_s=9.0)
    assert bucket.updated_s == 10.0
    assert bucket.take(1, now_s=10.4)


def test_replacement_keeps_the_tokens_held_refilled_to_now_at_the_old_rate() -> None:
    bucket = TokenBucket(SPEC, now_s=0.0)
    assert bucket.take(10, now_s=0.0)
    faster = TokenBucketSpec(max_tokens=20, tokens_per_fill=10, fill_interval_s=1.0)
    replaced = bucket.replaced(faster, now_s=1.0)  # 2.5 tokens at the old rate
    assert replaced.tokens == pytest.approx(2.5)
    assert replaced.spec == faster
    assert replaced.take(3, now_s=1.05)  # 2.5 + 0.5 at the new rate


def test_replacement_caps_the_tokens_at_the_new_max() -> None:
    bucket = TokenBucket(SPEC, now_s=0.0)
    smaller = TokenBucketSpec(max_tokens=4, tokens_per_fill=1, fill_interval_s=1.0)
    assert bucket.replaced(smaller, now_s=0.0).tokens == 4


def test_zero_max_tokens_refuses_everything() -> None:
    bucket = TokenBucket(TokenBucketSpec(0, 0, 1.0), now_s=0.0)
    assert not bucket.take(1, now_s=100.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 1, 1.0), "max_tokens and tokens_per_fill must be >= 0"),
        ((1, -1, 1.0), "max_tokens and tokens_per_fill must be >= 0"),
        ((1, 1, 0.0), "fill_interval must be > 0"),
    ],
)
def test_a_spec_refuses_what_cannot_be_enforced(args: tuple[int, int, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TokenBucketSpec(*args)
