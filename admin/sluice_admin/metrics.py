"""Usage figures for the pages, from the usage store's points: pure arithmetic.

Counters come from ``sluice.usage.store.UsagePoint``. A request is admitted (``allowed``),
refused (``over_limit``) or refused but let through by shadow mode (``shadow_over_limit``);
``near_limit`` counts admitted requests that used most of their limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sluice.usage.store import UsagePoint

__all__ = ["Totals", "Row", "rows", "totals"]


@dataclass(frozen=True)
class Totals:
    allowed: int = 0
    over_limit: int = 0
    shadow_over_limit: int = 0
    near_limit: int = 0
    backend_errors: int = 0

    @property
    def requests(self) -> int:
        return self.allowed + self.over_limit + self.shadow_over_limit

    @property
    def rejected(self) -> int:
        return self.over_limit

    @property
    def rejection_rate(self) -> float:
        return self.over_limit / self.requests if self.requests else 0.0

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.allowed + other.allowed,
            self.over_limit + other.over_limit,
            self.shadow_over_limit + other.shadow_over_limit,
            self.near_limit + other.near_limit,
            self.backend_errors + other.backend_errors,
        )


def totals(points: Iterable[UsagePoint], since_s: int, until_s: int) -> Totals:
    """Sums over the points with ``since_s <= bucket_s < until_s``."""
    out = Totals()
    for p in points:
        if since_s <= p.bucket_s < until_s:
            out += Totals(
                p.allowed, p.over_limit, p.shadow_over_limit, p.near_limit, p.backend_errors
            )
    return out


def domain_totals(series: Mapping[str, list[UsagePoint]], since_s: int, until_s: int) -> Totals:
    out = Totals()
    for points in series.values():
        out += totals(points, since_s, until_s)
    return out


@dataclass(frozen=True)
class Row:
    """One bucket of one series, for charts: a missing bucket is a zero, not a gap."""

    bucket_s: int
    admitted: int
    rejected: int
    shadow_rejected: int
    near_limit: int
    backend_errors: int


def rows(
    points: Iterable[UsagePoint], since_s: int, until_s: int, resolution_s: int = 1
) -> list[Row]:
    """Dense buckets ``since_s <= b < until_s`` (aligned to ``resolution_s``), summed over
    every series given (pass several rules' points to get a domain's total)."""
    start = since_s - since_s % resolution_s
    sums: dict[int, list[int]] = {b: [0] * 5 for b in range(start, until_s, resolution_s)}
    for p in points:
        bucket = sums.get(p.bucket_s - p.bucket_s % resolution_s)
        if bucket is None:
            continue
        values = (p.allowed, p.over_limit, p.shadow_over_limit, p.near_limit, p.backend_errors)
        for i, v in enumerate(values):
            bucket[i] += v
    return [Row(b, *v) for b, v in sorted(sums.items())]
