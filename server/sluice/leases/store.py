"""Where lease tables live: the ``LeaseStore`` protocol, one table per descriptor.

A descriptor is named by its counter key (``sluice.policies.snapshot.Match.counter_key``),
as algorithm state is. ``now`` is the caller's clock; a store may use its own (Redis's)
instead, so that instances whose clocks differ still agree on what has expired.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sluice.leases.table import Acquired, InFlight

__all__ = ["CounterKey", "LeaseStore"]

CounterKey = tuple[str, ...]


class LeaseStore(Protocol):
    async def acquire(
        self, key: CounterKey, lease_id: str, *, max_leases: int, ttl_s: float, now: float
    ) -> Acquired: ...

    async def renew(self, key: CounterKey, lease_id: str, *, ttl_s: float, now: float) -> bool: ...

    async def release(self, key: CounterKey, lease_id: str, *, now: float) -> bool: ...

    async def in_flight(self, keys: Sequence[CounterKey], *, now: float) -> list[InFlight]:
        """The leases held on each of ``keys``, in order (one round trip where it can be)."""
        ...

    async def close(self) -> None: ...
