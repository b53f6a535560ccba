"""One RLQS stream's state: its domain, its buckets, what each holds and was last sent.

Plain, synchronous code (the service drives it from its event loop, tests with a manual
clock): ``accept`` takes a report, ``assign`` turns a bucket's share of its limit into the
action to send, and ``due`` says which buckets need sending.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from sluice.edge.status import GrpcError, Status
from sluice.rlqs.assignment import TokenBucket, changed_enough, replacing, token_bucket
from sluice.rlqs.buckets import DENY_ALL, TOKEN_BUCKET, BucketIndex, Governed
from sluice.rlqs.shares import Demand, weight
from sluice.rlqs.wire import Action, BucketKey, Report

__all__ = ["Bucket", "Stream"]


class Bucket:
    __slots__ = (
        "computed",
        "demand",
        "governed",
        "last_elapsed_s",
        "last_report_s",
        "sent",
        "sent_at_s",
        "share",
    )

    def __init__(self, governed: Governed, now_s: float) -> None:
        self.governed = governed
        self.demand = Demand()
        self.last_report_s = now_s
        self.last_elapsed_s = 0.0
        # This stream's fraction of the limit, set by the service (None: not yet known).
        self.share: float | None = None
        self.sent: Action | None = None
        self.sent_at_s = -math.inf
        # (share, governed, bucket): the last token bucket computed, reused while both hold
        # (most buckets have one stream, whose share stays 1).
        self.computed: tuple[float, Governed, TokenBucket] | None = None

    @property
    def weight(self) -> float:
        return weight(self.demand.per_second, self.governed.rate_per_s)


class Stream:
    def __init__(self, stream_id: int, *, max_buckets: int, ttl_s: int) -> None:
        self.id = stream_id
        self.domain: str | None = None
        self.buckets: dict[BucketKey, Bucket] = {}
        self.max_buckets = max_buckets
        self.ttl_s = ttl_s

    def accept(self, report: Report, index: BucketIndex, now_s: float) -> list[BucketKey]:
        """Take one report (or a part of one): the keys of the buckets it names, in its
        order. Raises GrpcError for a report this stream cannot take (nothing of it is kept
        then)."""
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
        expired. A bucket whose limit changed holds no share until the next split."""
        assert self.domain is not None
        for key, bucket in self.buckets.items():
            if all_buckets or bucket.governed.expires_at_s <= now_s:
                governed = index.govern(self.domain, dict(key), now_s)
                if governed.share_key != bucket.governed.share_key:
                    bucket.share = None
                bucket.governed = governed

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

    def shared(self) -> Iterator[Bucket]:
        """The buckets whose limit is split between streams (token buckets)."""
        for bucket in self.buckets.values():
            if bucket.governed.kind == TOKEN_BUCKET:
                yield bucket

    def assign(self, key: BucketKey) -> Action:
        """What ``key`` should hold now, given its share."""
        bucket = self.buckets[key]
        governed = bucket.governed
        if governed.kind != TOKEN_BUCKET:
            return Action(key, governed.kind, self.ttl_s)
        share = bucket.share if bucket.share is not None else 0.0
        if share <= 0:
            # Nothing is free yet: the other holders give their part back within a rebalance.
            return Action(key, DENY_ALL, self.ttl_s)
        computed = bucket.computed
        if computed is not None and computed[0] == share and computed[1] is governed:
            new = computed[2]
        else:
            new = token_bucket(governed.rate_per_s * share, governed.burst * share)
            bucket.computed = (share, governed, new)
        sent = bucket.sent
        old = sent.token_bucket if sent is not None else None
        if old is not None:
            # Envoy refills a replaced bucket: small changes are not worth it.
            new = replacing(old, new) if changed_enough(old, new) else old
        return Action(key, TOKEN_BUCKET, self.ttl_s, new)

    def due(self, now_s: float) -> list[Action]:
        """Actions to push unasked: a bucket whose assignment changed, or whose last one is
        half-way to expiry (the data plane may report less often than the TTL)."""
        actions = []
        for key, bucket in self.buckets.items():
            action = self.assign(key)
            if action != bucket.sent or now_s - bucket.sent_at_s >= self.ttl_s / 2:
                actions.append(action)
        return actions

    def sent(self, actions: list[Action], now_s: float) -> None:
        for action in actions:
            bucket = self.buckets.get(action.bucket)
            if bucket is not None:
                bucket.sent = action
                bucket.sent_at_s = now_s
