from __future__ import annotations

from sluice.algorithms import ALGORITHMS, Limit, Outcome
from sluice.algorithms.fixed_window import WindowState, expires_at, step

TWO_PER_MINUTE = Limit(2, 60, ALGORITHMS["fixed_window"])


def test_windows_are_epoch_aligned_and_refused_hits_count() -> None:
    state, outcome = step(None, TWO_PER_MINUTE, 125.5, 1)
    assert (state, outcome) == (WindowState(120, 1), Outcome(True, 1, 54.5))
    state, outcome = step(state, TWO_PER_MINUTE, 130.0, 1)
    assert outcome == Outcome(True, 0, 50)
    state, outcome = step(state, TWO_PER_MINUTE, 179.75, 1)
    # The exact rest of the window: the limiter reports it as 1 s, as envoyproxy/ratelimit.
    assert (state, outcome) == (WindowState(120, 3), Outcome(False, 0, 0.25))
    state, outcome = step(state, TWO_PER_MINUTE, 180.0, 1)
    assert (state, outcome) == (WindowState(180, 1), Outcome(True, 1, 60))
    assert expires_at(state, TWO_PER_MINUTE) == 240


def test_cost_zero_checks_without_consuming() -> None:
    state, _ = step(None, Limit(1, 1, ALGORITHMS["fixed_window"]), 10.0, 1)
    assert step(state, Limit(1, 1, ALGORITHMS["fixed_window"]), 10.5, 0) == (
        WindowState(10, 1),
        Outcome(True, 0, 0.5),
    )


def test_a_cost_larger_than_the_limit_never_fits() -> None:
    # Counted all the same: its first 3 fill the window up to the limit.
    assert step(None, Limit(3, 1, ALGORITHMS["fixed_window"]), 0.0, 4)[1] == Outcome(
        False, 0, 1, fits=False, below_limit=3
    )


def test_a_refused_hit_says_how_much_of_it_fell_within_the_limit() -> None:
    ten = Limit(10, 60, ALGORITHMS["fixed_window"])
    state, outcome = step(WindowState(0, 8), ten, 1.0, 5)  # 8 + 5 = 13: 2 within, 3 past
    assert (state, outcome) == (WindowState(0, 13), Outcome(False, 0, 59, below_limit=2))
    state, outcome = step(state, ten, 2.0, 1)  # over already: nothing within
    assert (state, outcome) == (WindowState(0, 14), Outcome(False, 0, 58))
    _, outcome = step(WindowState(0, 10), ten, 2.0, 1)  # at the limit: nothing within
    assert outcome.below_limit == 0
    assert step(WindowState(0, 4), ten, 2.0, 6)[1] == Outcome(True, 0, 58)  # admitted


def test_limit_zero_refuses_everything() -> None:
    assert step(None, Limit(0, 1, ALGORITHMS["fixed_window"]), 0.0, 1)[1] == Outcome(
        False, 0, 1, fits=False
    )
