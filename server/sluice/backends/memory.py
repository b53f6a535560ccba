"""In-process state: the embedded default for a single instance.

Memory stays bounded two ways: state that has expired is dropped by a sweep that only looks
at keys due to expire (bucketed by expiry second, so it never scans every key), and a hard
cap on keys evicts the least recently used one, counted in ``evictions``.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from mypy_extensions import mypyc_attr

from sluice.algorithms import Outcome
from sluice.backends import Backend, Hit

__all__ = ["MemoryBackend", "synchronous_apply"]

_StateKey = tuple[Any, ...]  # counter key + (algorithm, period_s)


@mypyc_attr(allow_interpreted_subclasses=True)  # tests wrap it (setup.py compiles this module)
class MemoryBackend:
    def __init__(self, *, max_keys: int = 1_000_000) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.max_keys = max_keys
        self.evictions = 0
        self._states: OrderedDict[_StateKey, tuple[Any, int]] = OrderedDict()
        self._due: dict[int, list[_StateKey]] = {}  # expiry second -> keys that may expire
        self._due_heap: list[int] = []
        self._due_size = 0

    def __len__(self) -> int:
        return len(self._states)

    async def apply(self, hits: Sequence[Hit], now: float) -> list[tuple[Outcome, ...]]:
        return self.apply_now(hits, now)

    def apply_now(self, hits: Sequence[Hit], now: float) -> list[tuple[Outcome, ...]]:
        """The same as ``apply``, synchronously (no I/O happens here)."""
        self._expire(now)
        return [self._apply_one(hit, now) for hit in hits]

    def metric_values(self) -> dict[str, float]:
        return {
            "memory_backend_keys": len(self._states),
            "memory_backend_evictions": self.evictions,
        }

    async def close(self) -> None:
        self._states.clear()
        self._due.clear()
        self._due_heap.clear()
        self._due_size = 0

    def _apply_one(self, hit: Hit, now: float) -> tuple[Outcome, ...]:
        if len(hit.limits) == 1:
            return (self._apply_single(hit, now),)
        states = self._states
        keys = [hit.counter_key + (limit.algorithm.name, limit.period_s) for limit in hit.limits]
        stepped = []
        for key, limit in zip(keys, hit.limits, strict=True):
            entry = states.get(key)
            old = entry[0] if entry is not None else None
            new, outcome = limit.algorithm.step(old, limit, now, hit.cost)
            stepped.append((key, limit, entry, old, new, outcome))
        admitted = all(outcome.allowed for *_, outcome in stepped)
        for key, limit, entry, old, new, _ in stepped:
            # A refused hit changes nothing, except where refused hits count (fixed windows).
            if new is not old and (admitted or limit.algorithm.counts_refused):
                self._store(key, entry, new, limit.algorithm.expires_at(new, limit))
            elif entry is not None:
                states.move_to_end(key)
        # Only now, with every key of this hit the most recently used: evicting while storing
        # could drop a key of this very hit between reading and touching it.
        while len(states) > self.max_keys:
            states.popitem(last=False)
            self.evictions += 1
        return tuple(outcome for *_, outcome in stepped)

    def _apply_single(self, hit: Hit, now: float) -> Outcome:
        """``_apply_one`` for the common rule of one limit, without its bookkeeping lists."""
        states = self._states
        limit = hit.limits[0]
        algorithm = limit.algorithm
        key = hit.counter_key + (algorithm.name, limit.period_s)
        entry = states.get(key)
        old = entry[0] if entry is not None else None
        new, outcome = algorithm.step(old, limit, now, hit.cost)
        if new is not old and (outcome.allowed or algorithm.counts_refused):
            self._store(key, entry, new, algorithm.expires_at(new, limit))
            while len(states) > self.max_keys:
                states.popitem(last=False)  # never this key: it was just stored, last
                self.evictions += 1
        elif entry is not None:
            states.move_to_end(key)
        return outcome

    def _store(self, key: _StateKey, entry: tuple[Any, int] | None, state: Any, at: float) -> None:
        expires_at = math.ceil(at)
        if entry is None or entry[1] != expires_at:
            self._schedule(key, expires_at)
        self._states[key] = (state, expires_at)
        self._states.move_to_end(key)

    def _schedule(self, key: _StateKey, expires_at: int) -> None:
        bucket = self._due.get(expires_at)
        if bucket is None:
            bucket = self._due[expires_at] = []
            heapq.heappush(self._due_heap, expires_at)
        bucket.append(key)
        self._due_size += 1
        if self._due_size > 2 * self.max_keys + 1024:
            self._compact_due()

    def _compact_due(self) -> None:
        # LRU evictions leave stale entries in the expiry buckets; rebuilding them from the
        # live states keeps that bookkeeping proportional to max_keys (amortised O(1)).
        self._due.clear()
        for key, (_, expires_at) in self._states.items():
            self._due.setdefault(expires_at, []).append(key)
        self._due_heap = list(self._due)
        heapq.heapify(self._due_heap)
        self._due_size = len(self._states)

    def _expire(self, now: float) -> None:
        heap = self._due_heap
        while heap and heap[0] <= now:
            second = heapq.heappop(heap)
            keys = self._due.pop(second)
            self._due_size -= len(keys)
            for key in keys:
                entry = self._states.get(key)
                # The key may have been renewed with a later expiry since it was scheduled.
                if entry is not None and entry[1] <= now:
                    del self._states[key]


def synchronous_apply(
    backend: Backend,
) -> Callable[[Sequence[Hit], float], list[tuple[Outcome, ...]]] | None:
    """``backend.apply_now`` when ``backend`` is a MemoryBackend whose ``apply`` only calls
    it, so the limiter can skip the coroutine, which costs more than the step; None for any
    other backend, a subclass that overrides ``apply`` included."""
    if isinstance(backend, MemoryBackend) and type(backend).apply is MemoryBackend.apply:
        return backend.apply_now
    return None
