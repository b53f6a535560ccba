"""Sliding window log: exact, one entry per admitted timestamp.

A hit of cost ``n`` is admitted iff the costs admitted in ``(now - P, now]`` plus ``n`` stay
within ``L``. Only admitted hits are logged. An entry is live while ``ts + P > now``, written
that way (not ``ts > now - P``) so ``expires_at`` is exactly the newest entry's ``ts + P``.
Memory grows with ``L``: at most ``L`` entries are live, and hits at the same instant share
one entry.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from sluice.algorithms._exact import settle
from sluice.algorithms.base import Algorithm, Limit, Outcome

__all__ = ["ALGORITHM", "LogState", "expires_at", "step"]


@dataclass(frozen=True, slots=True)
class LogState:
    entries: tuple[tuple[float, int], ...]  # (timestamp, cost), oldest first, unique stamps


def _live(state: LogState | None, period: int, t: float) -> list[tuple[float, int]]:
    if state is None:
        return []
    return [(ts, cost) for ts, cost in state.entries if ts + period > t]


def _used(state: LogState | None, period: int, t: float) -> int:
    return sum(cost for _, cost in _live(state, period, t))


def step(
    state: LogState | None, limit: Limit, now: float, cost: int
) -> tuple[LogState | None, Outcome]:
    t = float(now)
    cap, period = limit.requests_per_unit, limit.period_s
    if cap == 0:
        return state, Outcome(False, 0, 0.0, fits=False)
    live = _live(state, period, t)
    used = sum(c for _, c in live)
    remaining = max(cap - used, 0)
    if cost > cap:
        return state, Outcome(False, remaining, 0.0, fits=False)
    if cost == 0:
        return state, Outcome(True, remaining, _until(state, limit, t))
    if used + cost <= cap:
        entries = list(live)
        for i, (ts, c) in enumerate(entries):
            if ts == t:
                entries[i] = (ts, c + cost)
                break
        else:
            bisect.insort(entries, (t, cost))
        new = LogState(tuple(entries))
        return new, Outcome(True, cap - used - cost, expires_at(new, limit) - t)
    # The oldest entries must age out until enough room is free.
    need = used + cost - cap
    freed = 0
    for ts, c in live:
        freed += c
        if freed >= need:
            at = ts + period
            break
    reset = settle(t, at - t, lambda x: _used(state, period, x) + cost <= cap)
    return state, Outcome(False, remaining, reset)


def _until(state: LogState | None, limit: Limit, t: float) -> float:
    if state is None:
        return 0.0
    return max(expires_at(state, limit) - t, 0.0)


def expires_at(state: LogState, limit: Limit) -> float:
    return state.entries[-1][0] + limit.period_s if state.entries else 0.0


ALGORITHM: Algorithm = Algorithm("sliding_window_log", step, expires_at, stores_each_request=True)
