"""Lease tables in this process's memory (``--backend memory``): exact for one instance.

Expired leases are dropped by the operation that next touches their table; a table left
untouched is found through a heap of expiry times and dropped by whichever operation runs
after it expired, so memory follows the leases held, not every descriptor ever seen.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Sequence

from sluice.leases import table
from sluice.leases.store import CounterKey, StoredTable
from sluice.leases.table import Acquired, InFlight

__all__ = ["MemoryLeaseStore"]

BATCH = 1000  # tables listed between two yields to the event loop


class MemoryLeaseStore:
    def __init__(self) -> None:
        self._tables: dict[CounterKey, dict[str, float]] = {}
        # (expires_at_s, key) for each lease granted or renewed; stale entries are harmless.
        self._expiries: list[tuple[float, CounterKey]] = []

    @property
    def tables(self) -> int:
        """How many descriptors hold leases (or held some not yet swept)."""
        return len(self._tables)

    def _sweep(self, now: float) -> None:
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, key = heapq.heappop(expiries)
            leases = self._tables.get(key)
            if leases is not None:
                table.prune(leases, now)
                if not leases:
                    del self._tables[key]

    async def acquire(
        self, key: CounterKey, lease_id: str, *, max_leases: int, ttl_s: float, now: float
    ) -> Acquired:
        self._sweep(now)
        leases = self._tables.setdefault(key, {})
        result = table.acquire(leases, lease_id, max_leases=max_leases, ttl_s=ttl_s, now=now)
        if result.granted:
            heapq.heappush(self._expiries, (now + ttl_s, key))
        elif not leases:
            del self._tables[key]
        return result

    async def renew(self, key: CounterKey, lease_id: str, *, ttl_s: float, now: float) -> bool:
        self._sweep(now)
        leases = self._tables.get(key)
        if leases is None or not table.renew(leases, lease_id, ttl_s=ttl_s, now=now):
            return False
        heapq.heappush(self._expiries, (now + ttl_s, key))
        return True

    async def release(self, key: CounterKey, lease_id: str, *, now: float) -> bool:
        self._sweep(now)
        leases = self._tables.get(key)
        if leases is None:
            return False
        released = table.release(leases, lease_id, now=now)
        if not leases:
            del self._tables[key]
        return released

    async def in_flight(self, keys: Sequence[CounterKey], *, now: float) -> list[InFlight]:
        self._sweep(now)
        return [table.in_flight(self._tables.get(key, {}), now=now) for key in keys]

    async def list_tables(self, *, now: float) -> AsyncIterator[list[StoredTable]]:
        self._sweep(now)
        keys = list(self._tables)
        for start in range(0, len(keys), BATCH):
            batch = []
            for key in keys[start : start + BATCH]:
                leases = self._tables.get(key)  # gone if released while the caller waited
                if leases is not None and (held := table.held(leases, now=now)).count:
                    batch.append(StoredTable(key, held))
            yield batch

    async def close(self) -> None:
        self._tables.clear()
        self._expiries.clear()
