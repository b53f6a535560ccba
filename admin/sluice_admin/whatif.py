"""What a limit would have admitted: traffic replayed through the server's own step functions.

The approximation, stated in the UI and in docs/admin.md: usage telemetry keeps per-second
totals per rule, not per key, so the recorded traffic is replayed as if every request of the
rule hit **one counter**, with a second's ``n`` requests spread evenly over it (at
``s + i/n``). For a rule keyed by a per-client value (``user``, ``remote_address``) that is
the worst case: each client really has its own counter and would be admitted more often.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.algorithms import Limit
from sluice.model import RateLimit
from sluice.policies.snapshot import compile_limit
from sluice.usage.store import UsagePoint

__all__ = [
    "MAX_REPLAY_HITS",
    "Replay",
    "Second",
    "bursty",
    "limits_of",
    "recorded",
    "simulate",
    "steady",
]

# Hits stepped one by one in Python: about a second of work. Above it the oldest seconds
# are left out (and the result says so) rather than making the page hang.
MAX_REPLAY_HITS = 300_000

Traffic = list[tuple[int, int]]  # (second, requests in that second), ascending


@dataclass(frozen=True)
class Second:
    second: int
    admitted: int
    rejected: int


@dataclass(frozen=True)
class Replay:
    seconds: list[Second]
    skipped_hits: int = 0  # left out to stay under MAX_REPLAY_HITS (the oldest ones)

    @property
    def admitted(self) -> int:
        return sum(s.admitted for s in self.seconds)

    @property
    def rejected(self) -> int:
        return sum(s.rejected for s in self.seconds)

    @property
    def rejection_rate(self) -> float:
        total = self.admitted + self.rejected
        return self.rejected / total if total else 0.0


def limits_of(limits: Iterable[RateLimit]) -> list[Limit]:
    """Rule limits as the algorithms take them (burst defaulting to the limit, as served)."""
    return [compile_limit(x) for x in limits]


def recorded(points: Iterable[UsagePoint]) -> Traffic:
    """Requests per second as recorded: admitted + refused + refused-in-shadow-mode.

    Backend errors are left out: those requests were never decided.
    """
    out = [(p.bucket_s, p.allowed + p.over_limit + p.shadow_over_limit) for p in points]
    return [(s, n) for s, n in out if n > 0]


def steady(rate_per_s: float, duration_s: int, *, start_s: int = 0) -> Traffic:
    """``rate_per_s`` on average every second (fractional rates spread: 0.5/s is one every
    other second)."""
    return [
        (start_s + t, math.floor((t + 1) * rate_per_s) - math.floor(t * rate_per_s))
        for t in range(duration_s)
    ]


def bursty(burst: int, every_s: int, duration_s: int, *, start_s: int = 0) -> Traffic:
    """``burst`` requests in the first second of every ``every_s``, nothing in between."""
    return [(start_s + t, burst if t % every_s == 0 else 0) for t in range(duration_s)]


def simulate(
    limits: Sequence[Limit], traffic: Traffic, *, max_hits: int = MAX_REPLAY_HITS
) -> Replay:
    """Replay ``traffic`` through one counter per limit, as the memory backend applies them:
    a hit is admitted iff every limit admits it; a refused hit changes no state, except that
    fixed windows count every hit."""
    traffic, skipped = _budget(traffic, max_hits)
    states: list[Any] = [None] * len(limits)
    seconds = []
    for second, n in traffic:
        admitted = 0
        for i in range(n):
            now = second + i / n
            stepped = [x.algorithm.step(s, x, now, 1) for s, x in zip(states, limits, strict=True)]
            ok = all(outcome.allowed for _, outcome in stepped)
            for j, ((new, _), limit) in enumerate(zip(stepped, limits, strict=True)):
                if ok or limit.algorithm.counts_refused:
                    states[j] = new
            admitted += ok
        seconds.append(Second(second, admitted, n - admitted))
    return Replay(seconds, skipped)


def _budget(traffic: Traffic, max_hits: int) -> tuple[Traffic, int]:
    """The most recent seconds whose hits fit in ``max_hits``; and how many were left out."""
    total, keep = 0, len(traffic)
    for index in range(len(traffic) - 1, -1, -1):
        if total + traffic[index][1] > max_hits:
            break
        total += traffic[index][1]
        keep = index
    else:
        return traffic, 0
    skipped = sum(n for _, n in traffic[:keep])
    return traffic[keep:], skipped
