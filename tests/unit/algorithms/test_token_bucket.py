from __future__ import annotations

from hypothesis import given, settings

from sluice.algorithms import ALGORITHMS, Limit, Outcome, token_bucket
from sluice.algorithms.token_bucket import BucketState, expires_at, step
from tests.support.algorithm_properties import check_sequence, limits, sequences, start_times
from tests.support.examples import examples

HALF_PER_SECOND = Limit(1, 2, ALGORITHMS["token_bucket"], burst=4)  # 0.5 tokens/s, capacity 4


def test_a_new_key_starts_full_and_refills_fractionally() -> None:
    state, outcome = step(None, HALF_PER_SECOND, 0.0, 4)
    assert (state, outcome) == (BucketState(0.0, 0.0), Outcome(True, 0, 8.0))
    refused, outcome = step(state, HALF_PER_SECOND, 1.0, 1)  # 0.5 tokens
    assert refused is state
    assert outcome == Outcome(False, 0, 1.0)
    assert not step(state, HALF_PER_SECOND, 1.999, 1)[1].allowed
    state, outcome = step(state, HALF_PER_SECOND, 2.0, 1)
    assert (state, outcome) == (BucketState(0.0, 2.0), Outcome(True, 0, 8.0))
    state, outcome = step(state, HALF_PER_SECOND, 5.0, 1)  # 1.5 tokens, 0.5 left
    assert (state, outcome) == (BucketState(0.5, 5.0), Outcome(True, 0, 7.0))
    assert step(state, HALF_PER_SECOND, 5.0, 2)[1] == Outcome(False, 0, 3.0)


def test_slow_rates_do_not_starve_under_constant_probing() -> None:
    limit = Limit(1, 10, ALGORITHMS["token_bucket"], burst=1)
    state, _ = step(None, limit, 0.0, 1)
    for t in (3.0, 6.0, 9.0, 9.999):
        assert not step(state, limit, t, 1)[1].allowed
    assert step(state, limit, 10.0, 1)[1].allowed


def test_remaining_is_whole_tokens() -> None:
    limit = Limit(3, 1, ALGORITHMS["token_bucket"], burst=10)
    state, _ = step(None, limit, 0.0, 10)
    state, outcome = step(state, limit, 0.9, 1)  # 2.7 tokens, 1.7 left
    assert outcome.remaining == 1
    assert step(state, limit, 0.9, 1)[1].allowed
    assert not step(step(state, limit, 0.9, 1)[0], limit, 0.9, 1)[1].allowed


def test_a_clock_stepping_back_refills_nothing() -> None:
    state, _ = step(None, HALF_PER_SECOND, 10.0, 4)
    assert not step(state, HALF_PER_SECOND, 5.0, 1)[1].allowed
    assert step(state, HALF_PER_SECOND, 12.0, 1)[1].allowed


def test_cost_zero_checks_without_consuming() -> None:
    state, _ = step(None, HALF_PER_SECOND, 0.0, 3)
    assert step(state, HALF_PER_SECOND, 1.0, 0) == (state, Outcome(True, 1, 5.0))


def test_a_cost_above_the_burst_never_fits() -> None:
    assert step(None, HALF_PER_SECOND, 0.0, 5) == (None, Outcome(False, 4, 0.0, fits=False))


def test_limit_zero_admits_nothing() -> None:
    for cost in (0, 1):
        outcome = step(None, Limit(0, 1, ALGORITHMS["token_bucket"], 3), 0.0, cost)[1]
        assert outcome == Outcome(False, 0, 0.0, fits=False)


def test_expires_when_full_again() -> None:
    assert expires_at(BucketState(1.0, 10.0), HALF_PER_SECOND) == 16.0


@settings(max_examples=examples(300), deadline=None)
@given(limit=limits("token_bucket"), t0=start_times, steps=sequences())
def test_properties(limit: Limit, t0: float, steps: list[tuple[float, int]]) -> None:
    check_sequence(token_bucket, limit, t0, steps)
