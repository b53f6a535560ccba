"""A quota's state, shared by Quota (a thread) and AsyncQuota (a task): the buckets seen, what
each admitted and refused since its last report, the assignment each holds, and when the
next report is due. Pure: the time is passed in and nothing here does I/O or locks, so the
two shells cannot disagree and the rules are tested with plain numbers.

Rules (docs/clients.md, "Quota"):
- a bucket's first decision is reported at once (with that decision's count), then every
  ``report_interval_s`` with the others; a new stream reports every bucket at once;
- a bucket without a live assignment (none yet, expired, or one without a time to live
  whose stream ended) is decided by the fallback (the client's ``on_unavailable``);
- an abandon action forgets the bucket; a bucket with no decision for ``IDLE_REPORTS``
  reports in a row is forgotten too (memory stays bounded by the buckets in use), and the
  server lets its assignment lapse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from sluice_client._token_bucket import TokenBucket, TokenBucketSpec
from sluice_client.errors import InvalidRequest
from sluice_client.types import QuotaDecision

__all__ = [
    "IDLE_REPORTS",
    "Action",
    "BucketKey",
    "QuotaState",
    "Strategy",
    "Usage",
    "bucket_key",
    "reconnect_delay_s",
]

# A tuple of (key, value) pairs sorted by key: a bucket's identity, whatever the order the
# caller's mapping (or the server's protobuf map) gives.
BucketKey: TypeAlias = tuple[tuple[str, str], ...]
Strategy: TypeAlias = TokenBucketSpec | Literal["allow_all", "deny_all"]

IDLE_REPORTS = 12  # a minute at the default 5 s interval

_ALLOWED = QuotaDecision(allowed=True)
_DENIED = QuotaDecision(allowed=False)
_DEGRADED = {
    True: QuotaDecision(allowed=True, degraded=True),
    False: QuotaDecision(allowed=False, degraded=True),
}

_MIN_RECONNECT_S = 0.1
_MAX_RECONNECT_S = 5.0  # the same cap as the channel's reconnect backoff (_channel.py)


@dataclass(frozen=True, slots=True)
class Usage:
    """One bucket's line in a report."""

    bucket: BucketKey
    allowed: int
    denied: int
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class Action:
    """One of the server's bucket actions: ``strategy`` None abandons the bucket;
    ``ttl_s`` None is an assignment without a time to live (held while its stream is up)."""

    bucket: BucketKey
    strategy: Strategy | None
    ttl_s: float | None = None


class _Held:
    __slots__ = ("expires_s", "strategy", "token_bucket")

    def __init__(
        self, strategy: Strategy, expires_s: float | None, token_bucket: TokenBucket | None
    ) -> None:
        self.strategy = strategy
        self.expires_s = expires_s
        self.token_bucket = token_bucket


class _Bucket:
    __slots__ = ("allowed", "denied", "held", "idle_reports", "reported_s", "used")

    def __init__(self, now_s: float) -> None:
        self.allowed = 0
        self.denied = 0
        self.reported_s = now_s
        self.held: _Held | None = None
        self.used = True  # a decision since the last report
        self.idle_reports = 0


def bucket_key(bucket: Mapping[str, str]) -> BucketKey:
    """A bucket's identity, refusing what the server would refuse (naming the field)."""
    if not isinstance(bucket, Mapping):
        raise InvalidRequest(f"bucket: must be a mapping of str to str, not {type(bucket)!r}")
    if not bucket:
        raise InvalidRequest("bucket: must have at least one entry")
    for key, value in bucket.items():
        if not isinstance(key, str) or not key:
            raise InvalidRequest(f"bucket: keys must be non-empty strings, not {key!r}")
        if not isinstance(value, str):
            raise InvalidRequest(f"bucket[{key!r}]: must be a string, not {type(value)!r}")
    return tuple(sorted(bucket.items()))


def check_cost(cost: int) -> int:
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise InvalidRequest(f"cost: must be a whole number >= 1, not {cost!r}")
    return cost


def reconnect_delay_s(attempt: int, *, jitter: float) -> float:
    """How long to wait before reconnecting after ``attempt`` failed streams in a row:
    doubling from 0.1 s up to 5 s; ``jitter`` in [0, 1) spreads it over [half, full] so that
    clients cut off together do not come back together."""
    full = min(_MAX_RECONNECT_S, _MIN_RECONNECT_S * 2.0 ** min(attempt, 16))
    return full * (0.5 + jitter / 2)


class QuotaState:
    def __init__(self, *, report_interval_s: float, now_s: float) -> None:
        self.report_interval_s = report_interval_s
        self._buckets: dict[BucketKey, _Bucket] = {}
        self._unreported: set[BucketKey] = set()
        self._next_report_s = now_s + report_interval_s

    def __len__(self) -> int:
        return len(self._buckets)

    def decide(
        self, bucket: Mapping[str, str], cost: int, *, now_s: float, fallback: bool | None
    ) -> tuple[QuotaDecision | None, bool]:
        """The decision for ``cost`` requests of ``bucket`` (None: no assignment and no
        fallback, i.e. ``on_unavailable="raise"``), and whether the bucket is new (a report
        is due at once)."""
        try:
            key = tuple(sorted(bucket.items()))
            entry = self._buckets.get(key)
        except (AttributeError, TypeError):
            entry = None
        new = entry is None
        if entry is None:
            key = bucket_key(bucket)
            entry = self._buckets[key] = _Bucket(now_s)
            self._unreported.add(key)
        entry.used = True
        held = entry.held
        if held is not None and held.expires_s is not None and now_s >= held.expires_s:
            held = entry.held = None
        if held is None:
            if fallback is None:
                return None, new
            decision = _DEGRADED[fallback]
        elif held.token_bucket is not None:
            decision = _ALLOWED if held.token_bucket.take(cost, now_s=now_s) else _DENIED
        else:
            decision = _ALLOWED if held.strategy == "allow_all" else _DENIED
        if decision.allowed:
            entry.allowed += cost
        else:
            entry.denied += cost
        return decision, new

    def due_in_s(self, now_s: float) -> float:
        """Seconds until a report is due (<= 0: now)."""
        if self._unreported:
            return 0.0
        return self._next_report_s - now_s

    def take_report(self, now_s: float) -> list[Usage]:
        """The usages to send now, their counts reset: every bucket when the interval is up,
        else the buckets never reported on this stream."""
        if now_s >= self._next_report_s:
            self._next_report_s = now_s + self.report_interval_s
            self._forget_idle()
            keys: Iterable[BucketKey] = list(self._buckets)
        else:
            keys = [k for k in self._unreported if k in self._buckets]
        self._unreported.clear()
        usages = []
        for key in keys:
            entry = self._buckets[key]
            usages.append(
                Usage(key, entry.allowed, entry.denied, max(0.0, now_s - entry.reported_s))
            )
            entry.allowed = entry.denied = 0
            entry.reported_s = now_s
        return usages

    def _forget_idle(self) -> None:
        for key, entry in list(self._buckets.items()):
            if entry.used:
                entry.used = False
                entry.idle_reports = 0
                continue
            entry.idle_reports += 1
            if entry.idle_reports >= IDLE_REPORTS:
                del self._buckets[key]

    def apply(self, actions: Iterable[Action], *, now_s: float) -> None:
        for action in actions:
            entry = self._buckets.get(action.bucket)
            if entry is None:
                continue  # forgotten meanwhile; an assignment for it would never be used
            if action.strategy is None:
                del self._buckets[action.bucket]
                self._unreported.discard(action.bucket)
                continue
            expires_s = None if action.ttl_s is None else now_s + action.ttl_s
            token_bucket = None
            if isinstance(action.strategy, TokenBucketSpec):
                held = entry.held
                live = held is not None and (held.expires_s is None or now_s < held.expires_s)
                if live and held is not None and held.token_bucket is not None:
                    token_bucket = held.token_bucket.replaced(action.strategy, now_s=now_s)
                else:
                    # A first token bucket (or one after a blanket rule or a lapse) starts
                    # full, as Envoy's does: a quiet bucket admits its first requests.
                    token_bucket = TokenBucket(action.strategy, now_s=now_s)
            entry.held = _Held(action.strategy, expires_s, token_bucket)

    def stream_started(self) -> None:
        """A new stream knows nothing: every bucket is reported on it at once."""
        self._unreported.update(self._buckets)

    def stream_lost(self) -> None:
        """Assignments with a time to live stay until it runs out (Sluice lets them expire
        when it drains, and a reconnect within it changes nothing); those without one lived
        only as long as their stream."""
        for entry in self._buckets.values():
            if entry.held is not None and entry.held.expires_s is None:
                entry.held = None

    def drop_assignments(self) -> None:
        """The quota is closed: every bucket falls back from now on."""
        for entry in self._buckets.values():
            entry.held = None

    def held_strategy(self, bucket: Mapping[str, str], *, now_s: float) -> Strategy | None:
        """The live assignment of ``bucket`` (None when it has none): for tests and logs."""
        entry = self._buckets.get(bucket_key(bucket))
        if entry is None or entry.held is None:
            return None
        if entry.held.expires_s is not None and now_s >= entry.held.expires_s:
            return None
        return entry.held.strategy
