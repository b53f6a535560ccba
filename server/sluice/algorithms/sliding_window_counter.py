"""Sliding window counter: two epoch-aligned window counts, the previous one decaying.

``estimate = C_prev * (P - e) / P + C_cur`` where ``e`` is how far ``now`` is into the
current window; a hit of cost ``n`` is admitted iff ``estimate + n <= L``. The previous
window's count stays readable for the whole current window, so state is
``(window_start, C_cur, C_prev)``. Constant memory, approximate where the log is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.algorithms._exact import largest, settle
from sluice.algorithms.base import Algorithm, Limit, Outcome

__all__ = ["ALGORITHM", "CounterState", "estimate", "expires_at", "step"]


@dataclass(frozen=True, slots=True)
class CounterState:
    window_start: float  # a whole multiple of the period
    current: int
    previous: int  # the count of the window before window_start


def _window(t: float, period: int) -> float:
    # Exact for a whole period and 0 <= t < 2**53 - period: the rounded t / period never
    # reaches the next whole number (each window start is at least one ulp of t away, and
    # that is more than half an ulp of the quotient), and the product is a whole number
    # below 2**53. tests/unit/algorithms/test_sliding_window_counter.py searches for a case.
    return math.floor(t / period) * period


def _counts(state: CounterState | None, start: float, period: int) -> tuple[int, int]:
    """(current, previous) counts as seen from the window beginning at ``start``."""
    if state is None:
        return 0, 0
    if state.window_start == start:
        return state.current, state.previous
    if state.window_start == start - period:
        return 0, state.current
    return 0, 0


def _estimate(previous: int, current: int, e: float, period: int) -> float:
    return previous * (period - e) / period + current


def estimate(state: CounterState | None, limit: Limit, now: float) -> float:
    """The weighted count a hit at ``now`` is judged against."""
    t = float(now)
    start = _window(t, limit.period_s)
    current, previous = _counts(state, start, limit.period_s)
    return _estimate(previous, current, t - start, limit.period_s)


def _remaining(est: float, cap: int) -> int:
    return largest(math.floor(cap - est), lambda k: est + k <= cap)


def step(
    state: CounterState | None, limit: Limit, now: float, cost: int
) -> tuple[CounterState | None, Outcome]:
    t = float(now)
    cap, period = limit.requests_per_unit, limit.period_s
    if cap == 0:
        return state, Outcome(False, 0, 0.0, fits=False)
    start = _window(t, period)
    e = t - start
    current, previous = _counts(state, start, period)
    est = _estimate(previous, current, e, period)
    if cost > cap:
        return state, Outcome(False, _remaining(est, cap), 0.0, fits=False)
    if cost == 0:
        until = max(expires_at(state, limit) - t, 0.0) if state is not None else 0.0
        return state, Outcome(True, _remaining(est, cap), until)
    if est + cost <= cap:
        new = CounterState(start, current + cost, previous)
        after = _estimate(previous, current + cost, e, period)
        return new, Outcome(True, _remaining(after, cap), expires_at(new, limit) - t)
    at = _earliest(previous, current, start, limit, cost)
    reset = settle(t, at - t, lambda x: estimate(state, limit, x) + cost <= cap)
    return state, Outcome(False, _remaining(est, cap), reset)


def _earliest(previous: int, current: int, start: float, limit: Limit, cost: int) -> float:
    """When ``cost`` fits again, solved in exact arithmetic (``settle`` absorbs rounding)."""
    cap, period = limit.requests_per_unit, limit.period_s
    room = cap - cost - current
    if room > 0 and previous > 0:
        # Still in this window: the previous window's share decays until the room suffices.
        return start + (period - room * period / previous)
    room = cap - cost
    if current <= room:
        return start + period
    if room > 0:
        # In the next window this window's count is the decaying share.
        return start + period + (period - room * period / current)
    return start + 2 * period


def expires_at(state: CounterState, limit: Limit) -> float:
    if state.current > 0:
        return state.window_start + 2 * limit.period_s
    if state.previous > 0:
        return state.window_start + limit.period_s
    return state.window_start


ALGORITHM: Algorithm = Algorithm("sliding_window_counter", step, expires_at)
