"""Where lease tables live: the ``LeaseStore`` protocol, one table per descriptor.

A descriptor is named by its counter key (``sluice.policies.snapshot.Match.counter_key``),
as algorithm state is. ``now`` is the caller's clock; a store may use its own (Redis's)
instead, so that instances whose clocks differ still agree on what has expired.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from sluice.leases.table import Acquired, Held, InFlight

__all__ = ["CounterKey", "LeaseStore", "StoredTable"]

CounterKey = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StoredTable:
    """One descriptor's lease table as its store lists it. ``key`` None: the store cannot
    name the descriptor (Redis names a long one by a hash of it); ``stored_as`` says where
    it lives then (the Redis key)."""

    key: CounterKey | None
    held: Held
    stored_as: str = ""


class LeaseStore(Protocol):
    async def acquire(
        self, key: CounterKey, lease_id: str, *, max_leases: int, ttl_s: float, now: float
    ) -> Acquired: ...

    async def renew(self, key: CounterKey, lease_id: str, *, ttl_s: float, now: float) -> bool: ...

    async def release(self, key: CounterKey, lease_id: str, *, now: float) -> bool: ...

    async def in_flight(self, keys: Sequence[CounterKey], *, now: float) -> list[InFlight]:
        """The leases held on each of ``keys``, in order (one round trip where it can be)."""
        ...

    def list_tables(self, *, now: float) -> AsyncIterator[list[StoredTable]]:
        """Every table holding leases, in batches (the caller may yield to the event loop
        between them). It changes no lease: it is for operators, never on the request path."""
        ...

    async def close(self) -> None: ...
