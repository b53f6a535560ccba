from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.algorithms import ALGORITHMS, Limit, Outcome, sliding_window_counter
from sluice.algorithms.sliding_window_counter import (
    CounterState,
    _window,
    estimate,
    expires_at,
    step,
)
from tests.support.algorithm_properties import check_sequence, limits, sequences, start_times
from tests.support.examples import examples

FIFTY_PER_MINUTE = Limit(50, 60, ALGORITHMS["sliding_window_counter"])


def test_worked_example_42_previous_18_current_15_s_in() -> None:
    state, outcome = step(None, FIFTY_PER_MINUTE, 10.0, 42)
    assert (state, outcome) == (CounterState(0, 42, 0), Outcome(True, 8, 110.0))
    # 15 s into the next minute 42 * 45/60 = 31.5 of the previous minute still counts.
    state, outcome = step(state, FIFTY_PER_MINUTE, 75.0, 18)
    assert state == CounterState(60, 18, 42)
    assert estimate(state, FIFTY_PER_MINUTE, 75.0) == 49.5
    assert outcome == Outcome(True, 0, 105.0)
    refused, outcome = step(state, FIFTY_PER_MINUTE, 75.0, 1)
    assert refused is state
    assert not outcome.allowed and outcome.remaining == 0
    # 42 * (60 - e) / 60 + 18 + 1 <= 50 from e = 60 - 31 * 60 / 42 = 15.714...
    assert abs(outcome.reset_s - (60 - 31 * 60 / 42 - 15)) < 1e-12
    assert step(state, FIFTY_PER_MINUTE, 75.0 + outcome.reset_s, 1)[1].allowed
    assert not step(state, FIFTY_PER_MINUTE, 75.7, 1)[1].allowed


def test_the_previous_window_counts_until_the_current_one_ends() -> None:
    state, _ = step(None, FIFTY_PER_MINUTE, 0.0, 50)
    assert estimate(state, FIFTY_PER_MINUTE, 119.25) == 50 * 0.75 / 60
    assert step(state, FIFTY_PER_MINUTE, 119.25, 50)[1] == Outcome(False, 49, 0.75)
    assert estimate(state, FIFTY_PER_MINUTE, 120.0) == 0
    assert step(state, FIFTY_PER_MINUTE, 120.0, 50)[1].allowed


def test_reset_may_reach_into_the_next_window() -> None:
    state, _ = step(None, Limit(4, 10, ALGORITHMS["sliding_window_counter"]), 5.0, 4)
    # Full now; in the next window the 4 decay: 4 * (10 - e) / 10 + 2 <= 4 from e = 5.
    outcome = step(state, Limit(4, 10, ALGORITHMS["sliding_window_counter"]), 6.0, 2)[1]
    assert outcome == Outcome(False, 0, 9.0)
    # Cost == limit: only once both windows are empty.
    outcome = step(state, Limit(4, 10, ALGORITHMS["sliding_window_counter"]), 6.0, 4)[1]
    assert outcome == Outcome(False, 0, 14.0)


def test_a_skipped_window_forgets_everything() -> None:
    state = CounterState(60, 18, 42)
    assert estimate(state, FIFTY_PER_MINUTE, 180.0) == 0
    assert expires_at(state, FIFTY_PER_MINUTE) == 180


def test_cost_zero_checks_without_consuming() -> None:
    state, _ = step(None, FIFTY_PER_MINUTE, 0.0, 20)
    assert step(state, FIFTY_PER_MINUTE, 90.0, 0) == (state, Outcome(True, 40, 30.0))


def test_a_cost_above_the_limit_never_fits() -> None:
    assert step(None, FIFTY_PER_MINUTE, 0.0, 51) == (None, Outcome(False, 50, 0.0, fits=False))


def test_limit_zero_admits_nothing() -> None:
    for cost in (0, 1):
        outcome = step(None, Limit(0, 60, ALGORITHMS["sliding_window_counter"]), 0.0, cost)[1]
        assert outcome == Outcome(False, 0, 0.0, fits=False)


@settings(max_examples=examples(300), deadline=None)
@given(limit=limits("sliding_window_counter"), t0=start_times, steps=sequences())
def test_properties(limit: Limit, t0: float, steps: list[tuple[float, int]]) -> None:
    check_sequence(sliding_window_counter, limit, t0, steps)


# Whole periods the policies compile to (units, fixed-length month and year) and odd ones.
PERIODS = st.one_of(
    st.sampled_from([1, 60, 3600, 86400, 604800, 2592000, 31536000]),
    st.integers(1, 10**7),
)


@st.composite
def times_near_a_window_start(draw: st.DrawFn) -> tuple[float, int]:
    """A time a few ulps below (or at) a multiple of the period: where t / period rounding up
    to the next whole number would put the window's start after t."""
    period = draw(PERIODS)
    t = float(draw(st.integers(1, 2**34 // period + 1)) * period)
    for _ in range(draw(st.integers(0, 3))):
        t = math.nextafter(t, 0.0)
    return t, period


@settings(max_examples=examples(2000))
@given(
    case=st.one_of(
        times_near_a_window_start(),
        st.tuples(st.floats(0.0, 2.0**34, allow_nan=False), PERIODS),
    )
)
def test_the_window_is_the_exact_multiple_of_the_period_at_or_before_t(
    case: tuple[float, int],
) -> None:
    t, period = case
    start = _window(t, period)
    assert start == Fraction(t) // period * period  # exact arithmetic: floor(t / period)
    assert start <= t < start + period
