"""What every algorithm is and takes: ``Limit`` in, ``Outcome`` out, one ``Algorithm`` each.

An algorithm is a pure step function over its own state plus the few traits the rest of
Sluice asks about (how long state lives, whether it takes ``burst``, whether refused hits
count, how resets are reported, whether its memory grows with the limit). Backends, the
policy loader, the limiter and the Redis scripts read these traits; none of them compares an
algorithm's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.algorithms.calendar import Calendar
from sluice.model import RateLimit
from sluice.records import record

__all__ = ["Algorithm", "Limit", "Outcome"]


@record
class Outcome:
    """What one hit on one limit came to."""

    allowed: bool
    remaining: int  # whole requests (of cost 1) still admissible now
    # When refused: seconds until a hit of the same cost would be admitted (never early).
    # When admitted: seconds until the state is fully reset.
    reset_s: float
    delay_s: float = 0.0  # leaky_bucket: how long the admitted hit must wait for its turn
    fits: bool = True  # False: the cost can never be admitted (cost > limit or burst)
    local: bool = False  # a refusal answered by the local over-limit cache, not the backend
    # A refused hit of an algorithm that counts refused hits (fixed windows): the part of its
    # cost that still fell within the limit (the window held less than the limit before it).
    # envoyproxy/ratelimit's statistics count only the rest as over the limit.
    below_limit: int = 0


# (state or None, limit, now, cost) -> (new state, outcome); a refused hit returns the old
# state itself (the same object), except where ``counts_refused``.
Step = Callable[[Any, "Limit", float, int], tuple[Any, Outcome]]
# (state, limit) -> the time from which the state is equivalent to no state at all.
ExpiresAt = Callable[[Any, "Limit"], float]


@dataclass(frozen=True, slots=True, eq=False)
class Algorithm:
    """One algorithm. Instances are singletons (``sluice.algorithms.ALGORITHMS``), so they
    compare and hash by identity."""

    name: str  # as written in policies, in Redis key names and in the Lua file's name
    step: Step
    expires_at: ExpiresAt
    takes_burst: bool = False  # a capacity separate from requests_per_unit
    counts_refused: bool = False  # refused hits change the state too (fixed windows)
    whole_second_resets: bool = False  # resets go to clients rounded up to whole seconds
    # Memory per key grows with requests_per_unit, so policies cap the limit
    # (--max-sliding-log-limit).
    stores_each_request: bool = False
    # Its windows can follow a calendar (``Limit.calendar``): the algorithms that count in
    # windows. The others have no window to align (a rate, a bucket, a log of instants).
    calendar_windows: bool = False

    def __repr__(self) -> str:
        return f"<algorithm {self.name}>"


@dataclass(frozen=True, slots=True)
class Limit:
    """One compiled limit: what the algorithm needs, and the policy's limit it came from.

    ``requests_per_unit`` per ``period_s`` seconds, counted by ``algorithm``; ``burst`` is the
    capacity of the algorithms that take one (compiled from the policy: ``requests_per_unit``
    when not given). ``rate_limit`` is what clients are told in ``current_limit``.
    ``calendar``, when set, replaces the epoch-aligned windows of ``period_s`` by calendar
    windows (``period_s`` stays the unit's nominal length, which names the state's key).
    """

    requests_per_unit: int
    period_s: int
    algorithm: Algorithm
    burst: int = 0
    rate_limit: RateLimit | None = None
    calendar: Calendar | None = None
