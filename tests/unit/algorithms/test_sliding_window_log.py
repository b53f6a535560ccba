from __future__ import annotations

from hypothesis import given, settings

from sluice.algorithms import ALGORITHMS, Limit, Outcome, sliding_window_log
from sluice.algorithms.sliding_window_log import LogState, expires_at, step
from tests.support.algorithm_properties import check_sequence, limits, sequences, start_times
from tests.support.examples import examples

THREE_PER_TEN_S = Limit(3, 10, ALGORITHMS["sliding_window_log"])


def test_admits_by_the_costs_in_the_last_period() -> None:
    state, outcome = step(None, THREE_PER_TEN_S, 0.0, 1)
    assert outcome == Outcome(True, 2, 10.0)
    state, outcome = step(state, THREE_PER_TEN_S, 2.0, 2)
    assert (state, outcome) == (LogState(((0.0, 1), (2.0, 2))), Outcome(True, 0, 10.0))
    refused, outcome = step(state, THREE_PER_TEN_S, 5.0, 1)
    assert refused is state
    assert outcome == Outcome(False, 0, 5.0)  # when the entry at 0 ages out
    assert step(state, THREE_PER_TEN_S, 5.0, 2)[1] == Outcome(False, 0, 7.0)  # both must go
    assert not step(state, THREE_PER_TEN_S, 9.999, 1)[1].allowed
    state, outcome = step(state, THREE_PER_TEN_S, 10.0, 1)  # (t - P, t]: 0 is out
    assert (state, outcome) == (LogState(((2.0, 2), (10.0, 1))), Outcome(True, 0, 10.0))


def test_hits_at_one_instant_share_an_entry() -> None:
    state, _ = step(None, THREE_PER_TEN_S, 1.5, 1)
    state, outcome = step(state, THREE_PER_TEN_S, 1.5, 1)
    assert (state, outcome) == (LogState(((1.5, 2),)), Outcome(True, 1, 10.0))


def test_cost_zero_checks_without_consuming() -> None:
    state, _ = step(None, THREE_PER_TEN_S, 0.0, 2)
    assert step(state, THREE_PER_TEN_S, 4.0, 0) == (state, Outcome(True, 1, 6.0))
    assert step(None, THREE_PER_TEN_S, 4.0, 0) == (None, Outcome(True, 3, 0.0))


def test_a_cost_above_the_limit_never_fits() -> None:
    assert step(None, THREE_PER_TEN_S, 0.0, 4) == (None, Outcome(False, 3, 0.0, fits=False))


def test_limit_zero_admits_nothing() -> None:
    for cost in (0, 1):
        outcome = step(None, Limit(0, 10, ALGORITHMS["sliding_window_log"]), 0.0, cost)[1]
        assert outcome == Outcome(False, 0, 0.0, fits=False)


def test_expires_when_the_newest_entry_ages_out() -> None:
    assert expires_at(LogState(((2.0, 2), (10.0, 1))), THREE_PER_TEN_S) == 20.0


@settings(max_examples=examples(300), deadline=None)
@given(limit=limits("sliding_window_log"), t0=start_times, steps=sequences())
def test_properties(limit: Limit, t0: float, steps: list[tuple[float, int]]) -> None:
    check_sequence(sliding_window_log, limit, t0, steps)
