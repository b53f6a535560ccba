"""StreamRateLimitQuotas without a transport: the streams, the rebalance, the drain.

Both gRPC transports hand ``QuotaService.stream`` the call's request messages and send
what it yields; a refusal is raised as ``GrpcError`` (sluice/edge/status.py), as
ShouldRateLimit's core does.

Per stream, a reader task takes each report as it arrives: it subscribes the stream to the
report's buckets and answers with an assignment for each (which refreshes its time to live).
Every ``rebalance_interval_s``, and at once when a new snapshot is installed, the rebalance
looks buckets up again where the policy changed, forgets those no longer reported, exchanges
demand with the other instances and pushes the assignments that changed (or are half-way to
expiry). On drain every stream ends with UNAVAILABLE: the data planes reconnect, to another
instance if there is one, and keep enforcing their assignments until those expire
(docs/rlqs.md says why Sluice does not abandon them).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from sluice.bounds import RequestBounds
from sluice.clock import Clock
from sluice.edge.status import GrpcError, Status
from sluice.grpc.core import DRAINING_MESSAGE
from sluice.policies.snapshot import Snapshot
from sluice.rlqs.buckets import ALLOW_ALL, DENY_ALL, TOKEN_BUCKET, BucketIndex
from sluice.rlqs.exchange import DemandExchange, LocalExchange
from sluice.rlqs.session import Stream
from sluice.rlqs.wire import (
    Action,
    BucketKey,
    BucketUsage,
    Report,
    encode_actions,
    read_domain,
    read_usages,
)
from sluice.usage.recorder import ALLOWED, OVER_LIMIT, UsageRecorder

__all__ = ["RLQS_USAGE_SUFFIX", "QuotaService", "QuotaSettings"]

log = logging.getLogger(__name__)

# Usage reported over RLQS is recorded under the rule's id with this suffix, so the admin
# and the metrics show it apart from ShouldRateLimit's (the data plane decided it).
RLQS_USAGE_SUFFIX = " (rlqs)"
STRATEGY_NAMES = {TOKEN_BUCKET: "token_bucket", ALLOW_ALL: "allow_all", DENY_ALL: "deny_all"}

_END = object()
CHUNK = 1000  # buckets taken between two yields of the event loop
ShareKey = tuple[str, ...]


@dataclass(frozen=True)
class QuotaSettings:
    ttl_s: int = 15
    max_buckets_per_stream: int = 10_000
    rebalance_interval_s: float = 1.0
    bounds: RequestBounds = RequestBounds()


class _Open:
    """An open stream: its state, what waits to be sent on it, the index it was looked up in."""

    __slots__ = ("index", "outbox", "stream")

    def __init__(self, stream: Stream, index: BucketIndex) -> None:
        self.stream = stream
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        self.index = index


class QuotaService:
    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        clock: Clock,
        *,
        settings: QuotaSettings = QuotaSettings(),
        exchange: DemandExchange | None = None,
        recorder: UsageRecorder | None = None,
        on_assignments: Callable[[str, int], None] | None = None,
    ) -> None:
        """``on_assignments(strategy, n)``: n bucket actions of that strategy were sent."""
        self._snapshot = snapshot
        self._clock = clock
        self.settings = settings
        self._exchange: DemandExchange = exchange if exchange is not None else LocalExchange()
        self._recorder = recorder
        self._on_assignments = on_assignments
        self._open: dict[int, _Open] = {}
        self._ids = itertools.count(1)
        self._index = BucketIndex(snapshot())
        self._draining = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.reports = 0  # report messages taken

    # -- what /metrics reads

    @property
    def streams(self) -> int:
        return len(self._open)

    @property
    def buckets(self) -> int:
        return sum(len(o.stream.buckets) for o in self._open.values())

    # -- what the runtime view reads (sluice/rlqs/listing.py), never changes

    def open_streams(self) -> list[Stream]:
        return [o.stream for o in self._open.values()]

    # -- lifecycle

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rlqs rebalance")

    def snapshot_changed(self) -> None:
        """A new snapshot is installed: rebalance now, not at the next interval."""
        self._wake.set()

    async def drain(self) -> None:
        """End every stream with UNAVAILABLE, and refuse new ones."""
        self._draining = True
        for open_ in self._open.values():
            open_.outbox.put_nowait(GrpcError(Status.UNAVAILABLE, DRAINING_MESSAGE))

    async def stop(self) -> None:
        await self.drain()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._exchange.close()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.rebalance_interval_s)
            self._wake.clear()
            try:
                await self.rebalance()
            except Exception:
                log.exception("RLQS rebalance failed")

    # -- one stream

    async def stream(
        self, requests: AsyncIterator[Any], context: object = None
    ) -> AsyncIterator[bytes]:
        """The responses of one StreamRateLimitQuotas call, as RateLimitQuotaResponse bytes.
        ``context`` (the transport's) is not used: it lets the edge call this as the handler
        itself."""
        if self._draining:
            raise GrpcError(Status.UNAVAILABLE, DRAINING_MESSAGE)
        open_ = _Open(
            Stream(
                next(self._ids),
                max_buckets=self.settings.max_buckets_per_stream,
                ttl_s=self.settings.ttl_s,
            ),
            self._current_index(),
        )
        self._open[open_.stream.id] = open_
        reader = asyncio.ensure_future(self._read(open_, requests))
        try:
            while True:
                item = await open_.outbox.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            del self._open[open_.stream.id]
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, open_: _Open, requests: AsyncIterator[Any]) -> None:
        try:
            async for message in requests:
                response = await self._on_report(open_, message)
                if response is not None:
                    open_.outbox.put_nowait(response)
        except GrpcError as exc:
            open_.outbox.put_nowait(exc)
            return
        except Exception:
            log.exception("RLQS stream %d failed", open_.stream.id)
            open_.outbox.put_nowait(GrpcError(Status.INTERNAL, "internal error in the stream"))
            return
        open_.outbox.put_nowait(_END)  # the data plane closed its side: so do we

    async def _on_report(self, open_: _Open, message: Any) -> bytes | None:
        report = await self._read_report(message)
        stream = open_.stream
        now = self._clock.now()
        index = self._current_index()
        if open_.index is not index and stream.domain is not None:
            stream.regovern(index, now, all_buckets=True)
        open_.index = index
        if stream.domain is None and report.domain and not index.has_domain(report.domain):
            raise GrpcError(
                Status.NOT_FOUND,
                f"domain: '{report.domain}' has no policy on this server "
                f"(publish one, or correct the data plane's domain)",
            )
        # A report of thousands of buckets is taken a chunk at a time, yielding the event loop
        # in between: ShouldRateLimit calls on this instance wait for one chunk, not for all.
        keys: list[BucketKey] = []
        usages = report.usages
        for start in range(0, len(usages), CHUNK):
            if start:
                await asyncio.sleep(0)
            part = Report(report.domain, usages[start : start + CHUNK])
            keys += stream.accept(part, index, now)
            self._record_usage(stream, part)
        self.reports += 1
        if not keys:
            return None
        await self._share_new_buckets(stream)
        unique = list(dict.fromkeys(keys))
        actions: list[Action] = []
        for start in range(0, len(unique), CHUNK):
            if start:
                await asyncio.sleep(0)
            actions += [stream.assign(key) for key in unique[start : start + CHUNK]]
        stream.sent(actions, now)
        self._count(actions)
        return encode_actions(actions)

    async def _read_report(self, message: Any) -> Report:
        """The whole report, validated a chunk at a time (about 3 µs a bucket) with the event
        loop yielded in between; a bad bucket anywhere refuses it before any is taken."""
        bounds = self.settings.bounds
        domain = read_domain(message, bounds)
        usages: list[BucketUsage] = []
        for start in range(0, len(message.bucket_quota_usages), CHUNK):
            if start:
                await asyncio.sleep(0)
            usages += read_usages(message, bounds, start, start + CHUNK)
        return Report(domain, tuple(usages))

    async def _share_new_buckets(self, stream: Stream) -> None:
        """Give the stream's new buckets their share now, so its first requests are
        governed; the other streams on those limits give theirs up at the rebalance this
        wakes (until then they may hold their floor's worth too much)."""
        new = {b.governed.share_key for b in stream.shared() if b.share is None}
        if not new:
            return
        weights = {k: w for k, w in self._local_weights().items() if k in new}
        grants = await self._exchange.exchange(weights)
        for bucket in stream.shared():
            key = bucket.governed.share_key
            if bucket.share is None and key in weights:
                bucket.share = grants.get(key, 0.0) * bucket.weight / weights[key]
        self._wake.set()

    # -- every stream

    async def rebalance(self) -> None:
        now = self._clock.now()
        index = self._current_index()
        for open_ in self._open.values():
            stream = open_.stream
            if stream.domain is None:
                continue
            stream.regovern(index, now, all_buckets=open_.index is not index)
            open_.index = index
            stream.drop_silent(now)
        weights = self._local_weights()
        grants = await self._exchange.exchange(weights)
        for open_ in list(self._open.values()):
            for bucket in open_.stream.shared():
                key = bucket.governed.share_key
                if key in weights:  # else it came in a report while Redis answered
                    bucket.share = grants.get(key, 0.0) * bucket.weight / weights[key]
            actions = open_.stream.due(now)
            if actions:
                open_.stream.sent(actions, now)
                self._count(actions)
                open_.outbox.put_nowait(encode_actions(actions))

    def _local_weights(self) -> dict[ShareKey, float]:
        """Per limit, the weight of every stream of this instance on it."""
        weights: dict[ShareKey, float] = {}
        for open_ in self._open.values():
            for bucket in open_.stream.shared():
                key = bucket.governed.share_key
                weights[key] = weights.get(key, 0.0) + bucket.weight
        return weights

    def _current_index(self) -> BucketIndex:
        snapshot = self._snapshot()
        if self._index.snapshot is not snapshot:
            self._index = BucketIndex(snapshot)
        return self._index

    def _record_usage(self, stream: Stream, report: Report) -> None:
        if self._recorder is None:
            return
        for usage in report.usages:
            bucket = stream.buckets.get(usage.bucket)
            if bucket is None or not bucket.governed.rule_id:
                continue
            rule = bucket.governed.rule_id + RLQS_USAGE_SUFFIX
            if usage.allowed:
                self._recorder.record(rule, ALLOWED, cost=usage.allowed)
            if usage.denied:
                # As ShouldRateLimit records it: the counter key after the domain.
                share_key = bucket.governed.share_key
                parts = share_key[1:] if share_key else (p for kv in usage.bucket for p in kv)
                offender = ",".join(parts)
                self._recorder.record(rule, OVER_LIMIT, cost=usage.denied, offender=offender)

    def _count(self, actions: list[Action]) -> None:
        if self._on_assignments is None:
            return
        counts: dict[int, int] = {}
        for action in actions:
            counts[action.kind] = counts.get(action.kind, 0) + 1
        for kind, n in counts.items():
            self._on_assignments(STRATEGY_NAMES[kind], n)
