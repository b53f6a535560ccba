"""The RLQS buckets of the open streams with their current assignments, for operators: the
busiest first (by the demand their data plane reports), at most ``limit`` of them with the
count of the rest, so an instance holding 10,000 buckets answers with a page.

An assignment is what was last *sent* for the bucket (what the data plane enforces until it
expires), not what the rebalance would compute next; None before the first was sent.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from sluice.rlqs.session import Stream
from sluice.rlqs.wire import Action, BucketKey

__all__ = ["BucketListing", "BucketRow", "list_buckets"]


@dataclass(frozen=True, slots=True)
class BucketRow:
    """One bucket of one stream. ``rate_per_s`` and ``burst``: the governing limit whole
    (every stream together; 0 for a blanket rule); ``share``: this stream's fraction of it
    (None: not split yet); ``demand_per_s``: requests a second the data plane reports
    (allowed plus denied); ``expires_in_s``: until the last assignment sent runs out."""

    stream: int
    domain: str
    bucket: BucketKey
    rule_id: str
    rate_per_s: float
    burst: int
    share: float | None
    assignment: Action | None
    demand_per_s: float
    reported_s_ago: float
    expires_in_s: float | None


@dataclass(frozen=True, slots=True)
class BucketListing:
    rows: tuple[BucketRow, ...]
    streams: int
    buckets: int

    @property
    def omitted(self) -> int:
        return self.buckets - len(self.rows)


def list_buckets(
    streams: Iterable[Stream], *, now_s: float, domain: str = "", limit: int = 100
) -> BucketListing:
    """The ``limit`` buckets with the most demand, of the streams of ``domain`` (or all)."""
    chosen = [s for s in streams if s.domain is not None and (not domain or s.domain == domain)]
    buckets = sum(len(s.buckets) for s in chosen)
    busiest = heapq.nlargest(
        limit,
        ((b.demand.per_second, s, key) for s in chosen for key, b in s.buckets.items()),
        key=lambda item: item[0],
    )
    rows = tuple(_row(stream, key, now_s) for _, stream, key in busiest)
    return BucketListing(rows, len(chosen), buckets)


def _row(stream: Stream, key: BucketKey, now_s: float) -> BucketRow:
    bucket = stream.buckets[key]
    governed = bucket.governed
    sent = bucket.sent
    return BucketRow(
        stream.id,
        stream.domain or "",
        key,
        governed.rule_id,
        governed.rate_per_s,
        governed.burst,
        bucket.share,
        sent,
        bucket.demand.per_second,
        now_s - bucket.last_report_s,
        bucket.sent_at_s + sent.ttl_s - now_s if sent is not None else None,
    )
