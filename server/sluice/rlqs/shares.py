"""How one limit is split between the streams reporting its bucket.

Each stream's share follows its demand, the requests per second it reports (allowed plus
denied: what it was asked, not what it was given), over its last ``WINDOW`` reports. Every
stream also weighs ``FLOOR`` of the limit's rate beyond its demand, so a quiet data plane
still holds enough to admit its first requests, and a stream that has not reported any
traffic yet (its first report has no elapsed time) starts from that floor:

    share(stream) = (demand(stream) + FLOOR × rate) / (Σ demand + streams × FLOOR × rate)

The shares of all streams add up to one whatever their demands. A stream that goes quiet
loses its demand within ``WINDOW`` reports, and its share flows to the others with it.
Across instances the sums are global: each instance adds its own streams and learns the
others' through the demand exchange (exchange.py).
"""

from __future__ import annotations

from collections import deque

from sluice.records import record

__all__ = ["FLOOR", "WINDOW", "Demand", "Totals", "share"]

FLOOR = 0.05
WINDOW = 2


@record
class Totals:
    """Demand (requests per second) and number of streams on one bucket."""

    demand: float
    streams: int


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


def share(demand: float, totals: Totals, rate_per_s: float) -> float:
    """This stream's share of a limit of ``rate_per_s``, given the bucket's ``totals`` (over
    every stream, this one included)."""
    floor = FLOOR * rate_per_s
    streams = max(1, totals.streams)
    whole = max(totals.demand, demand) + streams * floor
    return min(1.0, (demand + floor) / whole)
