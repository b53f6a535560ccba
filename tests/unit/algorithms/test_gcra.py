from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.algorithms import ALGORITHMS, Limit, Outcome, gcra
from sluice.algorithms._schedule import FOLD_CELLS
from sluice.algorithms.gcra import GcraState, expires_at, step
from tests.support.algorithm_properties import (
    check_fresh_burst,
    check_saturated_rate,
    check_sequence,
    limits,
    saturated_admissions,
    schedule_limits,
    schedule_times,
    sequences,
    start_times,
)
from tests.support.examples import examples

THREE_PER_MINUTE = Limit(3, 60, ALGORITHMS["gcra"], burst=3)  # T = 20 s, tau = 60 s


def test_three_per_minute_burst_then_one_every_twenty_seconds() -> None:
    state = None
    for remaining in (2, 1, 0):
        state, outcome = step(state, THREE_PER_MINUTE, 0.0, 1)
        assert outcome == Outcome(True, remaining, 60.0 - 20 * remaining)
    assert state == GcraState(0.0, 3)  # TAT = 0 + 3 * 20
    assert expires_at(state, THREE_PER_MINUTE) == 60.0
    refused, outcome = step(state, THREE_PER_MINUTE, 0.0, 1)
    assert refused is state
    assert outcome == Outcome(False, 0, 20.0)
    assert not step(state, THREE_PER_MINUTE, 19.999, 1)[1].allowed
    state, outcome = step(state, THREE_PER_MINUTE, 20.0, 1)
    assert (state, outcome) == (GcraState(0.0, 4), Outcome(True, 0, 60.0))
    assert expires_at(state, THREE_PER_MINUTE) == 80.0
    # Idle for a while: credit comes back one request per T, up to the burst.
    assert step(state, THREE_PER_MINUTE, 70.0, 0)[1] == Outcome(True, 2, 10.0)
    assert step(state, THREE_PER_MINUTE, 1000.0, 0)[1] == Outcome(True, 3, 0.0)


def test_costs_above_one() -> None:
    state, outcome = step(None, THREE_PER_MINUTE, 0.0, 2)
    assert (state, outcome) == (GcraState(0.0, 2), Outcome(True, 1, 40.0))
    assert expires_at(state, THREE_PER_MINUTE) == 40.0
    assert step(state, THREE_PER_MINUTE, 0.0, 2)[1] == Outcome(False, 1, 20.0)
    assert step(state, THREE_PER_MINUTE, 20.0, 2)[1].allowed


def test_remaining_counts_the_hits_that_really_pass() -> None:
    limit = Limit(10, 3, ALGORITHMS["gcra"], burst=7)  # T = 0.3: not a binary fraction
    state, outcome = step(None, limit, 1_700_000_000.1, 1)
    admitted = 0
    while step(state, limit, 1_700_000_000.1, 1)[1].allowed:
        state, _ = step(state, limit, 1_700_000_000.1, 1)
        admitted += 1
    assert admitted == outcome.remaining == 6


def test_cost_zero_checks_without_consuming() -> None:
    state, _ = step(None, THREE_PER_MINUTE, 0.0, 3)
    assert step(state, THREE_PER_MINUTE, 5.0, 0) == (state, Outcome(True, 0, 55.0))
    assert step(None, THREE_PER_MINUTE, 5.0, 0) == (None, Outcome(True, 3, 0.0))


def test_a_cost_above_the_burst_never_fits() -> None:
    assert step(None, THREE_PER_MINUTE, 0.0, 4) == (None, Outcome(False, 3, 0.0, fits=False))


def test_limit_zero_admits_nothing() -> None:
    for cost in (0, 1):
        assert step(None, Limit(0, 60, ALGORITHMS["gcra"], 3), 0.0, cost)[1] == Outcome(
            False, 0, 0.0, fits=False
        )


def test_expires_at_the_theoretical_arrival_time() -> None:
    assert expires_at(GcraState(80.0), THREE_PER_MINUTE) == 80.0


def test_cells_fold_into_the_base_rounded_up() -> None:
    one_per_second = Limit(1, 1, ALGORITHMS["gcra"], 3)  # T = 1: everything exact
    t = float(FOLD_CELLS - 3)
    busy = GcraState(0.0, FOLD_CELLS - 2)  # busy until t + 1
    state, outcome = step(busy, one_per_second, t, 2)
    assert (state, outcome) == (GcraState(float(FOLD_CELLS)), Outcome(True, 0, 3.0))
    # Where T is no binary fraction the folded TAT is rounded up: never early.
    limit = Limit(7, 3, ALGORITHMS["gcra"], 5)
    t = 1_764_000_000.123
    busy = GcraState(t - (FOLD_CELLS - 3) * (3 / 7), FOLD_CELLS - 1)
    state, outcome = step(busy, limit, t, 1)
    assert outcome.allowed and state.cells == 0
    assert state.base == expires_at(GcraState(busy.base, FOLD_CELLS), limit)
    for dt in (0.0, 0.5, 3 / 7, 1.0, 2.0):
        for cost in (1, 2, 5):
            folded = step(state, limit, t + dt, cost)[1]
            unfolded = step(GcraState(busy.base, FOLD_CELLS), limit, t + dt, cost)[1]
            assert unfolded.allowed or not folded.allowed


@settings(max_examples=examples(300), deadline=None)
@given(limit=limits("gcra"), t0=start_times, steps=sequences())
def test_properties(limit: Limit, t0: float, steps: list[tuple[float, int]]) -> None:
    check_sequence(gcra, limit, t0, steps)


def test_a_fresh_key_admits_the_whole_burst_at_once_for_every_rate() -> None:
    # 50 per minute, burst 50 used to admit 49: T = 1.2 s summed fifty times falls a few
    # ulps past tau = 1.2 * 50.
    for t in (0.0, 1000.0, 1_764_000_000.123):
        for rate in range(1, 201):
            check_fresh_burst(gcra, Limit(rate, 60, ALGORITHMS["gcra"], rate), t, 1)


@settings(max_examples=examples(300), deadline=None)
@given(shape=schedule_limits, t=schedule_times, data=st.data())
def test_a_fresh_key_admits_exactly_the_burst(shape: tuple[int, int, int], t: float, data) -> None:
    rate, period, burst = shape
    cost = data.draw(st.one_of(st.just(1), st.integers(1, burst)), label="cost")
    check_fresh_burst(gcra, Limit(rate, period, ALGORITHMS["gcra"], burst), t, cost)


def test_a_long_saturated_run_keeps_the_rate_without_drift() -> None:
    # 1000 per second from an epoch-scale time: each T = 0.001 added to a stored time used to
    # round by up to half an ulp (1.2e-7 s), the same way every time, so the admitted count
    # drifted by about one per ten thousand. Here hits come at twice the rate for 100 s.
    limit = Limit(1000, 1, ALGORITHMS["gcra"], 5)
    admitted, elapsed = saturated_admissions(gcra, limit, 1_764_000_000.123, 0.0005, 200_001)
    check_saturated_rate(limit, admitted, elapsed)
    # 100,000 hits at exactly the emission interval once the burst is spent: rounding may
    # refuse one (the time it arrives at rounds a hair early), which leaves a whole T of
    # slack for all the others. Drift used to refuse one in ten thousand here.
    t0 = 1_764_000_000.123
    limit = Limit(1004, 1, ALGORITHMS["gcra"], 5)
    state = None
    for _ in range(5):
        state, _ = step(state, limit, t0, 1)
    admitted = 0
    for i in range(1, 100_001):
        new, outcome = step(state, limit, t0 + i * (1 / 1004), 1)
        if outcome.allowed:
            state, admitted = new, admitted + 1
    assert admitted >= 99_999


@settings(max_examples=examples(25), deadline=None)
@given(shape=schedule_limits, t0=schedule_times, speed=st.sampled_from([1.5, 2.0, 3.0, 10.0]))
def test_saturation_admits_the_burst_then_the_rate(
    shape: tuple[int, int, int], t0: float, speed: float
) -> None:
    rate, period, burst = shape
    # A burst of 1 leaves no slack for hits that arrive between emission times (each waits
    # for the next arrival), so the rate is only reached from a burst of 2.
    limit = Limit(rate, period, ALGORITHMS["gcra"], max(burst, 2))
    gap = period / rate / speed  # hits arrive faster than the rate
    admitted, elapsed = saturated_admissions(gcra, limit, t0, gap, 10_000)
    check_saturated_rate(limit, admitted, elapsed)
