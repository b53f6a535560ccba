from __future__ import annotations

from sluice.algorithms import Outcome
from sluice.algorithms.fixed_window import WindowState, step


def test_windows_are_epoch_aligned_and_rejected_hits_count() -> None:
    state, outcome = step(None, limit=2, window_s=60, now=125.7, cost=1)
    assert (state, outcome) == (WindowState(120, 1), Outcome(True, 1, 55))
    state, outcome = step(state, 2, 60, 130.0, 1)
    assert outcome == Outcome(True, 0, 50)
    state, outcome = step(state, 2, 60, 179.9, 1)
    assert (state, outcome) == (WindowState(120, 3), Outcome(False, 0, 1))
    state, outcome = step(state, 2, 60, 180.0, 1)
    assert (state, outcome) == (WindowState(180, 1), Outcome(True, 1, 60))


def test_cost_zero_checks_without_consuming() -> None:
    state, _ = step(None, 1, 1, 10.0, 1)
    assert step(state, 1, 1, 10.5, 0) == (WindowState(10, 1), Outcome(True, 0, 1))


def test_a_cost_larger_than_the_limit_is_refused() -> None:
    assert step(None, 3, 1, 0.0, 4)[1] == Outcome(False, 0, 1)


def test_limit_zero_refuses_everything() -> None:
    assert step(None, 0, 1, 0.0, 1)[1].allowed is False
