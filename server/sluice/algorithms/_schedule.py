"""Virtual scheduling, shared by gcra and leaky_bucket (mirrored by ``schedule`` in Lua).

With ``T = P / L`` and ``tau = T * b``, a key keeps one time ``at`` (GCRA's theoretical
arrival time, the leaky bucket's drain time). A hit of cost ``n`` at ``t`` starts at
``start = max(at, t)`` and is admitted iff ``(start - t) + n * T <= tau``; then
``at' = start + n * T``. That is GCRA's ``t >= at' - tau`` in exact arithmetic, but written as
a wait so it is monotone in ``t`` under rounding and a fresh key always admits ``n <= b``.
From ``at`` on, the state is exactly like None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.algorithms._exact import largest, settle
from sluice.algorithms.base import Limit

__all__ = ["Scheduled", "schedule"]


@dataclass(frozen=True, slots=True)
class Scheduled:
    at: float | None  # the new time to store; None: leave the state alone
    allowed: bool
    remaining: int
    reset_s: float
    delay_s: float
    fits: bool


def _start(at: float | None, t: float) -> float:
    return t if at is None else max(at, t)


def _wait(at: float | None, t: float) -> float:
    return _start(at, t) - t


def _remaining(at: float | None, t: float, interval: float, tau: float) -> int:
    wait = _wait(at, t)
    return largest(math.floor((tau - wait) / interval), lambda k: wait + k * interval <= tau)


def schedule(at: float | None, limit: Limit, now: float, cost: int) -> Scheduled:
    t = float(now)
    rate, period, burst = limit.requests_per_unit, limit.period_s, limit.burst
    if rate == 0:
        return Scheduled(None, False, 0, 0.0, 0.0, False)
    interval = period / rate
    tau = interval * burst
    if cost > burst:
        return Scheduled(None, False, _remaining(at, t, interval, tau), 0.0, 0.0, False)
    if cost == 0:
        until = max(at - t, 0.0) if at is not None else 0.0
        return Scheduled(None, True, _remaining(at, t, interval, tau), until, 0.0, True)
    start = _start(at, t)
    wait = start - t
    if wait + cost * interval <= tau:
        new = start + cost * interval
        remaining = _remaining(new, t, interval, tau)
        return Scheduled(new, True, remaining, new - t, wait, True)
    need = cost * interval
    reset = settle(t, wait - (tau - need), lambda x: _wait(at, x) + need <= tau)
    return Scheduled(None, False, _remaining(at, t, interval, tau), reset, 0.0, True)
