"""Fixed window, exactly as envoyproxy/ratelimit counts.

Windows are aligned to the Unix epoch on whole seconds, and every hit is counted, refused
ones included (Redis ``INCRBY`` semantics), so a client that keeps hammering stays limited.
A refused hit reports in ``below_limit`` the part of its cost that still fell within the
limit (a hit of 5 on a window at 8 of 10: 2), which envoyproxy/ratelimit's statistics do not
count as over the limit. ``reset_s`` is the exact rest of the window: the over-limit cache
refuses until then, so it must not be late. The limiter reports it rounded up to whole
seconds, which is exactly what envoyproxy/ratelimit reports (``unit - now % unit`` on
whole-second ``now``).

With ``limit.calendar`` the window is the calendar window holding ``now`` instead
(``sluice.algorithms.calendar``), and the reset counts to its end.
"""

from __future__ import annotations

from sluice.algorithms.base import Algorithm, Limit, Outcome
from sluice.algorithms.calendar import window_index
from sluice.records import record

__all__ = ["ALGORITHM", "WindowState", "expires_at", "step"]


@record
class WindowState:
    window_start_s: int
    count: int


def step(
    state: WindowState | None, limit: Limit, now: float, cost: int
) -> tuple[WindowState, Outcome]:
    calendar = limit.calendar
    if calendar is None:
        now_s = int(now)
        period = limit.period_s
        start = now_s - now_s % period
        end = start + period
    else:
        bounds = calendar.boundaries(now)
        i = window_index(bounds, now)
        start, end = bounds[i], bounds[i + 1]
    count = state.count if state is not None and state.window_start_s == start else 0
    count += cost
    requests_per_unit = limit.requests_per_unit
    fits = cost <= requests_per_unit
    if count <= requests_per_unit:
        outcome = Outcome(True, requests_per_unit - count, end - now, fits=fits)
        return WindowState(start, count), outcome
    # Refused, and counted: the part of the hit up to the limit, if the window was below it.
    below = requests_per_unit - (count - cost)
    outcome = Outcome(False, 0, end - now, fits=fits, below_limit=below if below > 0 else 0)
    return WindowState(start, count), outcome


def expires_at(state: WindowState, limit: Limit) -> float:
    calendar = limit.calendar
    if calendar is None:
        return state.window_start_s + limit.period_s
    bounds = calendar.boundaries(state.window_start_s)
    return bounds[window_index(bounds, state.window_start_s) + 1]


ALGORITHM: Algorithm = Algorithm(
    "fixed_window",
    step,
    expires_at,
    counts_refused=True,
    whole_second_resets=True,
    calendar_windows=True,
)
