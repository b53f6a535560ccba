"""MemoryLeaseStore: the table per descriptor, and memory that follows the leases held."""

from __future__ import annotations

import asyncio

from sluice.leases import MemoryLeaseStore
from sluice.leases.table import Acquired, InFlight

A = ("jobs", "tenant", "a")
B = ("jobs", "tenant", "b")


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_descriptors_have_separate_tables() -> None:
    async def scenario() -> None:
        store = MemoryLeaseStore()
        assert await store.acquire(A, "1", max_leases=1, ttl_s=5, now=0) == Acquired(True, 1)
        assert await store.acquire(A, "2", max_leases=1, ttl_s=5, now=0) == Acquired(False, 1, 5)
        assert await store.acquire(B, "3", max_leases=1, ttl_s=5, now=0) == Acquired(True, 1)
        assert await store.in_flight([A, B, ("none",)], now=1) == [
            InFlight(1, 4.0),
            InFlight(1, 4.0),
            InFlight(0),
        ]
        assert await store.renew(A, "1", ttl_s=5, now=4)
        assert not await store.renew(B, "1", ttl_s=5, now=4)  # another descriptor's lease
        assert await store.release(A, "1", now=4)
        assert not await store.release(A, "1", now=4)

    run(scenario())


def test_tables_of_expired_leases_are_dropped_by_the_next_operation() -> None:
    async def scenario() -> None:
        store = MemoryLeaseStore()
        for n in range(100):
            await store.acquire(("jobs", "tenant", str(n)), "x", max_leases=1, ttl_s=5, now=0)
        assert store.tables == 100
        assert await store.renew(("jobs", "tenant", "7"), "x", ttl_s=5, now=4)
        await store.in_flight([A], now=5)  # the other 99 expired at 5
        assert store.tables == 1
        await store.in_flight([A], now=9)
        assert store.tables == 0
        # A refused acquire leaves nothing behind either.
        assert not (await store.acquire(A, "y", max_leases=0, ttl_s=5, now=9)).granted
        assert store.tables == 0

    run(scenario())
