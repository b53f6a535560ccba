"""One RLQS stream's state: its domain, its buckets, what each was last given.

Plain, synchronous code (the service drives it from its event loop, tests with a manual
clock): ``accept`` takes a report, ``assign`` turns a bucket and the totals over every
stream into the action to send, and ``due`` says which buckets need sending.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from sluice.edge.status import GrpcError, Status
from sluice.rlqs.assignment import changed_enough, token_bucket
from sluice.rlqs.buckets import TOKEN_BUCKET, BucketIndex, Governed
from sluice.rlqs.shares import Demand, Totals, share
from sluice.rlqs.wire import Action, BucketKey, Report

__all__ = ["Bucket", "Stream"]


class Bucket:
    __slots__ = ("demand", "governed", "last_report_s", "last_elapsed_s", "sent", "sent_at_s")

    def __init__(self, governed: Governed, now_s: float) -> None:
        self.governed = governed
        self.demand = Demand()
        self.last_report_s = now_s
        self.last_elapsed_s = 0.0
        self.sent: Action | None = None
        self.sent_at_s = -math.inf


class Stream:
    def __init__(self, stream_id: int, *, max_buckets: int, ttl_s: int) -> None:
        self.id = stream_id
        self.domain: str | None = None
        self.buckets: dict[BucketKey, Bucket] = {}
        self.max_buckets = max_buckets
        self.ttl_s = ttl_s

    def accept(self, report: Report, index: BucketIndex, now_s: float) -> list[BucketKey]:
        """Take one report: the keys of the buckets it names, in its order. Raises GrpcError
        for a report this stream cannot take (nothing of it is kept then)."""
        if self.domain is None:
            if not report.domain:
                raise GrpcError(
                    Status.INVALID_ARGUMENT,
                    "domain: the stream's first report must name the policy domain",
                )
            self.domain = report.domain
        elif report.domain and report.domain != self.domain:
            raise GrpcError(
                Status.INVALID_ARGUMENT,
                f"domain: '{report.domain}', but this stream reports for '{self.domain}' "
                f"(one stream per domain)",
            )
        new = {u.bucket for u in report.usages if u.bucket not in self.buckets}
        if len(self.buckets) + len(new) > self.max_buckets:
            raise GrpcError(
                Status.RESOURCE_EXHAUSTED,
                f"bucket_quota_usages: this stream would hold {len(self.buckets) + len(new)} "
                f"buckets, more than the maximum of {self.max_buckets} "
                f"(--rlqs-max-buckets-per-stream)",
            )
        keys = []
        for usage in report.usages:
            bucket = self.buckets.get(usage.bucket)
            if bucket is None:
                governed = index.govern(self.domain, dict(usage.bucket), now_s)
                bucket = self.buckets[usage.bucket] = Bucket(governed, now_s)
            bucket.demand.report(usage.allowed + usage.denied, usage.elapsed_s)
            bucket.last_report_s = now_s
            bucket.last_elapsed_s = usage.elapsed_s
            keys.append(usage.bucket)
        return keys

    def regovern(self, index: BucketIndex, now_s: float, *, all_buckets: bool) -> None:
        """Look the buckets up again: all of them (a new snapshot), or those whose pin
        expired."""
        assert self.domain is not None
        for key, bucket in self.buckets.items():
            if all_buckets or bucket.governed.expires_at_s <= now_s:
                bucket.governed = index.govern(self.domain, dict(key), now_s)

    def drop_silent(self, now_s: float) -> int:
        """Forget the buckets the data plane stopped reporting (it forgot them): none for a
        TTL, or three of its own reporting intervals if those are longer. How many went."""
        silent = [
            key
            for key, b in self.buckets.items()
            if now_s - b.last_report_s > max(self.ttl_s, 3 * b.last_elapsed_s)
        ]
        for key in silent:
            del self.buckets[key]
        return len(silent)

    def demands(self) -> Iterator[tuple[tuple[str, ...], float]]:
        """Each token-bucket bucket's share key and this stream's demand on it."""
        for bucket in self.buckets.values():
            if bucket.governed.kind == TOKEN_BUCKET:
                yield bucket.governed.share_key, bucket.demand.per_second

    def assign(self, key: BucketKey, totals: Mapping[tuple[str, ...], Totals]) -> Action:
        """What ``key`` should hold now, given the totals over every stream."""
        bucket = self.buckets[key]
        governed = bucket.governed
        if governed.kind != TOKEN_BUCKET:
            return Action(key, governed.kind, self.ttl_s)
        demand = bucket.demand.per_second
        fallback = Totals(demand, 1)
        fraction = share(demand, totals.get(governed.share_key, fallback), governed.rate_per_s)
        new = token_bucket(governed.rate_per_s * fraction, governed.burst * fraction)
        sent = bucket.sent
        old = sent.token_bucket if sent is not None and sent.kind == TOKEN_BUCKET else None
        if old is not None and not changed_enough(old, new):
            new = old  # Envoy refills a replaced bucket: small changes are not worth it
        return Action(key, TOKEN_BUCKET, self.ttl_s, new)

    def due(self, totals: Mapping[tuple[str, ...], Totals], now_s: float) -> list[Action]:
        """Actions to push unasked: a bucket whose assignment changed, or whose last one is
        half-way to expiry (the data plane may report less often than the TTL)."""
        actions = []
        for key, bucket in self.buckets.items():
            action = self.assign(key, totals)
            if action != bucket.sent or now_s - bucket.sent_at_s >= self.ttl_s / 2:
                actions.append(action)
        return actions

    def sent(self, actions: list[Action], now_s: float) -> None:
        for action in actions:
            bucket = self.buckets.get(action.bucket)
            if bucket is not None:
                bucket.sent = action
                bucket.sent_at_s = now_s
