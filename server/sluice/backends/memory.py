"""In-process state: the embedded default for a single instance.

Memory stays bounded two ways: state whose window has ended is dropped by a sweep that only
looks at keys due to expire (bucketed by expiry second, so it never scans every key), and a
hard cap on keys evicts the least recently used one, counted in ``evictions``.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence

from sluice.algorithms import Outcome, fixed_window
from sluice.algorithms.fixed_window import WindowState
from sluice.backends import Hit

__all__ = ["MemoryBackend"]


class MemoryBackend:
    def __init__(self, *, max_keys: int = 1_000_000) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.max_keys = max_keys
        self.evictions = 0
        self._states: OrderedDict[tuple[str, ...], tuple[WindowState, int]] = OrderedDict()
        self._due: dict[int, list[tuple[str, ...]]] = {}  # expiry second -> keys that may expire
        self._due_heap: list[int] = []
        self._due_size = 0

    def __len__(self) -> int:
        return len(self._states)

    async def apply(self, hits: Sequence[Hit], now: float) -> list[Outcome]:
        self._expire(int(now))
        outcomes = []
        states = self._states
        for hit in hits:
            entry = states.get(hit.counter_key)
            old = entry[0] if entry is not None else None
            state, outcome = fixed_window.step(old, hit.limit, hit.window_s, now, hit.cost)
            expires_at = state.expires_at_s(hit.window_s)
            if entry is None or entry[1] != expires_at:
                self._schedule(hit.counter_key, expires_at)
            states[hit.counter_key] = (state, expires_at)
            states.move_to_end(hit.counter_key)
            if len(states) > self.max_keys:
                states.popitem(last=False)
                self.evictions += 1
            outcomes.append(outcome)
        return outcomes

    async def close(self) -> None:
        self._states.clear()
        self._due.clear()
        self._due_heap.clear()

    def _schedule(self, key: tuple[str, ...], expires_at: int) -> None:
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

    def _expire(self, now_s: int) -> None:
        heap = self._due_heap
        while heap and heap[0] <= now_s:
            second = heapq.heappop(heap)
            keys = self._due.pop(second)
            self._due_size -= len(keys)
            for key in keys:
                entry = self._states.get(key)
                # The key may have moved on to a later window since it was scheduled here.
                if entry is not None and entry[1] <= now_s:
                    del self._states[key]
