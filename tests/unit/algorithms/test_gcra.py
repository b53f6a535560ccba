from __future__ import annotations

from hypothesis import given, settings

from sluice.algorithms import ALGORITHMS, Limit, Outcome, gcra
from sluice.algorithms.gcra import GcraState, expires_at, step
from tests.support.algorithm_properties import check_sequence, limits, sequences, start_times

THREE_PER_MINUTE = Limit(3, 60, ALGORITHMS["gcra"], burst=3)  # T = 20 s, tau = 60 s


def test_three_per_minute_burst_then_one_every_twenty_seconds() -> None:
    state = None
    for remaining in (2, 1, 0):
        state, outcome = step(state, THREE_PER_MINUTE, 0.0, 1)
        assert outcome == Outcome(True, remaining, 60.0 - 20 * remaining)
    assert state == GcraState(60.0)
    refused, outcome = step(state, THREE_PER_MINUTE, 0.0, 1)
    assert refused is state
    assert outcome == Outcome(False, 0, 20.0)
    assert not step(state, THREE_PER_MINUTE, 19.999, 1)[1].allowed
    state, outcome = step(state, THREE_PER_MINUTE, 20.0, 1)
    assert (state, outcome) == (GcraState(80.0), Outcome(True, 0, 60.0))
    # Idle for a while: credit comes back one request per T, up to the burst.
    assert step(state, THREE_PER_MINUTE, 70.0, 0)[1] == Outcome(True, 2, 10.0)
    assert step(state, THREE_PER_MINUTE, 1000.0, 0)[1] == Outcome(True, 3, 0.0)


def test_costs_above_one() -> None:
    state, outcome = step(None, THREE_PER_MINUTE, 0.0, 2)
    assert (state, outcome) == (GcraState(40.0), Outcome(True, 1, 40.0))
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


@settings(max_examples=300, deadline=None)
@given(limit=limits("gcra"), t0=start_times, steps=sequences())
def test_properties(limit: Limit, t0: float, steps: list[tuple[float, int]]) -> None:
    check_sequence(gcra, limit, t0, steps)
