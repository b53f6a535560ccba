"""Sliding window counter: two window counts, the previous one decaying.

``estimate = C_prev * (P - e) / P + C_cur`` where ``e`` is how far ``now`` is into the
current window and ``P`` its length; a hit of cost ``n`` is admitted iff ``estimate + n <= L``.
The previous window's count stays readable for the whole current window, so state is
``(window_start, C_cur, C_prev)``. Constant memory, approximate where the log is exact.

Windows are epoch-aligned multiples of the period, or with ``limit.calendar`` calendar
windows (``sluice.algorithms.calendar``), whose lengths differ: ``P`` is then the current
window's length, and the next window's own length decides when a hit fits again there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.algorithms._exact import largest, settle
from sluice.algorithms.base import Algorithm, Limit, Outcome
from sluice.algorithms.calendar import window_index

__all__ = ["ALGORITHM", "CounterState", "estimate", "expires_at", "step"]

# How windows are laid out for one step: the period (epoch-aligned windows), or the calendar
# boundaries around the step's ``now`` (the very numbers the Redis script is sent).
Spacing = int | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CounterState:
    window_start: float  # where a window starts: a whole multiple of the period, or a boundary
    current: int
    previous: int  # the count of the window before window_start


def _window(t: float, period: int) -> float:
    # Exact for a whole period and 0 <= t < 2**53 - period: the rounded t / period never
    # reaches the next whole number (each window start is at least one ulp of t away, and
    # that is more than half an ulp of the quotient), and the product is a whole number
    # below 2**53. tests/unit/algorithms/test_sliding_window_counter.py searches for a case.
    return math.floor(t / period) * period


def _spacing(limit: Limit, t: float) -> Spacing:
    calendar = limit.calendar
    return limit.period_s if calendar is None else calendar.boundaries(t)


def _window_of(spacing: Spacing, t: float) -> tuple[float, float, int]:
    """(start of the window before, start, length) of the window holding ``t``; lengths are
    whole seconds, kept as ints so ``_earliest`` multiplies exactly, as it always has."""
    if isinstance(spacing, int):
        start = _window(t, spacing)
        return start - spacing, start, spacing
    i = window_index(spacing, t)
    return float(spacing[i - 1]), float(spacing[i]), spacing[i + 1] - spacing[i]


def _next_length(spacing: Spacing, end: float) -> int:
    """The length of the window that begins at ``end``."""
    if isinstance(spacing, int):
        return spacing
    j = window_index(spacing, end)
    return spacing[j + 1] - spacing[j]


def _counts(state: CounterState | None, start: float, before: float) -> tuple[int, int]:
    """(current, previous) counts as seen from the window beginning at ``start``."""
    if state is None:
        return 0, 0
    if state.window_start == start:
        return state.current, state.previous
    if state.window_start == before:
        return 0, state.current
    return 0, 0


def _estimate(previous: int, current: int, e: float, length: int) -> float:
    return previous * (length - e) / length + current


def _estimate_at(state: CounterState | None, spacing: Spacing, t: float) -> float:
    before, start, length = _window_of(spacing, t)
    current, previous = _counts(state, start, before)
    return _estimate(previous, current, t - start, length)


def estimate(state: CounterState | None, limit: Limit, now: float) -> float:
    """The weighted count a hit at ``now`` is judged against."""
    t = float(now)
    return _estimate_at(state, _spacing(limit, t), t)


def _remaining(est: float, cap: int) -> int:
    return largest(math.floor(cap - est), lambda k: est + k <= cap)


def step(
    state: CounterState | None, limit: Limit, now: float, cost: int
) -> tuple[CounterState | None, Outcome]:
    t = float(now)
    cap = limit.requests_per_unit
    if cap == 0:
        return state, Outcome(False, 0, 0.0, fits=False)
    spacing = _spacing(limit, t)
    before, start, length = _window_of(spacing, t)
    e = t - start
    current, previous = _counts(state, start, before)
    est = _estimate(previous, current, e, length)
    if cost > cap:
        return state, Outcome(False, _remaining(est, cap), 0.0, fits=False)
    if cost == 0:
        until = 0.0
        if state is not None:
            until = max(_expires(state, spacing) - t, 0.0)
        return state, Outcome(True, _remaining(est, cap), until)
    if est + cost <= cap:
        new = CounterState(start, current + cost, previous)
        after = _estimate(previous, current + cost, e, length)
        return new, Outcome(True, _remaining(after, cap), _expires(new, spacing) - t)
    next_length = _next_length(spacing, start + length)
    at = _earliest(previous, current, start, length, next_length, cap - cost)
    reset = settle(t, at - t, lambda x: _estimate_at(state, spacing, x) + cost <= cap)
    return state, Outcome(False, _remaining(est, cap), reset)


def _earliest(
    previous: int, current: int, start: float, length: int, next_length: int, room: int
) -> float:
    """When ``room`` (the limit less the cost) holds the estimate again, solved in exact
    arithmetic (``settle`` absorbs rounding)."""
    left = room - current
    if left > 0 and previous > 0:
        # Still in this window: the previous window's share decays until the room suffices.
        return start + (length - left * length / previous)
    if current <= room:
        return start + length
    if room > 0:
        # In the next window this window's count is the decaying share.
        return start + length + (next_length - room * next_length / current)
    return start + length + next_length


def _expires(state: CounterState, spacing: Spacing) -> float:
    # Every state holds a hit of its own window (step writes one only when it admits), and
    # that hit counts until the window after it ends.
    w = state.window_start
    if isinstance(spacing, int):
        return w + 2 * spacing
    j = window_index(spacing, w)
    if spacing[j] != w:
        return w  # older than the windows in view: no hit sees its counts any more
    return float(spacing[j + 2])


def expires_at(state: CounterState, limit: Limit) -> float:
    return _expires(state, _spacing(limit, state.window_start))


ALGORITHM: Algorithm = Algorithm("sliding_window_counter", step, expires_at, calendar_windows=True)
