"""Virtual scheduling, shared by gcra and leaky_bucket (mirrored by ``schedule`` in Lua).

With ``T = P / L``, a key is busy until ``at`` (GCRA's theoretical arrival time, the leaky
bucket's drain time), and a hit of cost ``n`` at ``t`` is admitted iff it would wait at most
``b - n`` cells: ``(max(at, t) - t) + n * T <= b * T``. From ``at`` on, the key is exactly
like a missing one.

How ``at`` is kept matters. Summing ``at += n * T`` rounds at every hit (``T`` is rarely a
binary fraction, and an ulp of an epoch time is 2.4e-7 s), so a burst at one instant came out
a few ulps past ``b * T`` (50 per minute, burst 50, admitted 49), and a key kept busy drifted
the same way at every hit, without bound. So ``at`` is never summed: the state is a time
``base`` and a whole number of cells ``k``, ``at = base + k * T``, and

* a key whose schedule has run out (``(base - t) + k * T <= 0``, or no state) restarts at
  ``base = t, k = 0``;
* a hit of cost ``n`` is admitted iff ``(base - t) + (k + n - b) * T <= 0``, and then
  ``k += n`` (``base`` stays).

Each test is one subtraction, one product of an integer with ``T`` and one sign check of
their sum (which rounding cannot flip), whatever the history: errors never accumulate. On a
restarted key ``base - t`` is 0, so a burst at one instant admits exactly ``b // n`` hits of
cost ``n`` (the sign of ``(k + n - b) * T`` is exact), and under saturation admissions follow
``base + k * T`` with ``k`` counted exactly, so there is no drift.

``k`` only grows while a key stays busy: at most ``b`` plus the busy time over ``T``, far
below 2**53 (where doubles stop counting exactly, and Lua would part from Python's integers)
for any real key. Still, once ``k`` reaches ``FOLD_CELLS`` the cells are folded into the base:
``base' = expires_at`` (the first time, rounded up, from which the schedule has run out) and
``k' = 0``. Rounding up only ever makes ``at`` later, so a fold never admits early; it costs
at most an ulp or two of ``t`` once per 2**40 cells.

A change of rate reinterprets the ``k`` cells with the new ``T`` (like a token bucket's
tokens); the stored expiry (Redis TTL, the memory backend's sweep) still follows the old one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.algorithms._exact import largest, settle
from sluice.algorithms.base import Limit

__all__ = ["FOLD_CELLS", "Scheduled", "expires", "schedule"]

FOLD_CELLS = 2**40  # fold the cells into the base from here on (see above)

# (base, k): busy until base + k * T
Cells = tuple[float, int]


@dataclass(frozen=True, slots=True)
class Scheduled:
    cells: Cells | None  # the new state to store; None: leave the state alone
    allowed: bool
    remaining: int
    reset_s: float
    delay_s: float
    fits: bool


def _in_force(cells: Cells | None, t: float, interval: float) -> Cells:
    """The schedule a hit at ``t`` faces: the stored one, or ``(t, 0)`` once it has run out."""
    if cells is None:
        return t, 0
    base, k = cells
    if (base - t) + k * interval <= 0.0:
        return t, 0
    return base, k


def _admits(cells: Cells | None, t: float, interval: float, burst: int, cost: int) -> bool:
    base, k = _in_force(cells, t, interval)
    return (base - t) + (k + cost - burst) * interval <= 0.0


def _remaining(cells: Cells | None, t: float, interval: float, burst: int) -> int:
    base, k = _in_force(cells, t, interval)
    return largest(
        math.floor((t - base) / interval) + burst - k,
        lambda n: (base - t) + (k + n - burst) * interval <= 0.0,
    )


def _expires(cells: Cells, interval: float) -> float:
    base, k = cells
    return base + settle(base, k * interval, lambda x: (base - x) + k * interval <= 0.0)


def expires(cells: Cells, limit: Limit) -> float:
    """The first time (rounded up) from which ``cells`` is exactly like no state."""
    return _expires(cells, limit.period_s / limit.requests_per_unit)


def schedule(cells: Cells | None, limit: Limit, now: float, cost: int) -> Scheduled:
    t = float(now)
    rate, period, burst = limit.requests_per_unit, limit.period_s, limit.burst
    if rate == 0:
        return Scheduled(None, False, 0, 0.0, 0.0, False)
    interval = period / rate
    if cost > burst:
        return Scheduled(None, False, _remaining(cells, t, interval, burst), 0.0, 0.0, False)
    base, k = _in_force(cells, t, interval)
    wait = (base - t) + k * interval  # until the hit's turn: > 0 iff the schedule is in force
    if cost == 0:
        until = _expires((base, k), interval) - t if wait > 0.0 else 0.0
        return Scheduled(None, True, _remaining(cells, t, interval, burst), until, 0.0, True)
    short = (base - t) + (k + cost - burst) * interval  # > 0: how long until it would fit
    if short <= 0.0:
        new: Cells = (base, k + cost)
        if k + cost >= FOLD_CELLS:
            new = (_expires(new, interval), 0)
        remaining = _remaining(new, t, interval, burst)
        return Scheduled(new, True, remaining, _expires(new, interval) - t, wait, True)
    reset = settle(t, short, lambda x: _admits(cells, x, interval, burst, cost))
    return Scheduled(None, False, _remaining(cells, t, interval, burst), reset, 0.0, True)
