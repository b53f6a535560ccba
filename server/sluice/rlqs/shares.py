"""How one limit is split between the streams reporting its bucket.

Each stream weighs its demand, the requests per second it reports (allowed plus denied:
what it was asked, not what it was given) over its last ``WINDOW`` reports, plus ``FLOOR``
of the limit's rate, so a quiet data plane still holds enough to admit its first requests
and a stream that has not reported traffic yet (a first report has no elapsed time) starts
from that floor. A stream's share of the limit is its weight over the weight of every stream:

    share(stream) = (demand(stream) + FLOOR × rate) / Σ (demand + FLOOR × rate)

Across instances the limit is first split between instances, each granted the fraction its
streams' weight is of the whole, but never more than the others leave free (exchange.py);
an instance then splits its grant between its streams by weight. A stream that goes quiet
loses its demand within ``WINDOW`` reports, and its share flows to the others with it.
"""

from __future__ import annotations

from collections import deque

__all__ = ["FLOOR", "WINDOW", "Demand", "weight"]

FLOOR = 0.05
WINDOW = 2


def weight(demand: float, rate_per_s: float) -> float:
    """A stream's claim on a limit of ``rate_per_s``."""
    return demand + FLOOR * rate_per_s


class Demand:
    """One stream's demand on one bucket, from its usage reports."""

    __slots__ = ("_reports",)

    def __init__(self) -> None:
        self._reports: deque[tuple[int, float]] = deque(maxlen=WINDOW)

    def report(self, requests: int, elapsed_s: float) -> None:
        """Requests (allowed + denied) counted over ``elapsed_s`` since the last report. A
        report with no elapsed time (a data plane's first) says nothing of the rate."""
        if elapsed_s > 0:
            self._reports.append((requests, elapsed_s))

    @property
    def per_second(self) -> float:
        elapsed = sum(e for _, e in self._reports)
        return sum(r for r, _ in self._reports) / elapsed if elapsed > 0 else 0.0
