"""Concurrency leases: at most N held at once per descriptor (``rate_limit: {concurrency:
N}``), each expiring after its TTL unless renewed.

    table.py    the lease table of one descriptor, pure (the Lua scripts mirror it)
    store.py    LeaseStore: where tables live; memory.py (one instance), redis.py (shared)
    service.py  LeaseService: acquire / renew / release against the live rules
"""

from __future__ import annotations

from sluice.leases.memory import MemoryLeaseStore
from sluice.leases.service import Grant, LeaseService, Renewal
from sluice.leases.store import LeaseStore
from sluice.leases.table import Acquired, InFlight

__all__ = [
    "Acquired",
    "Grant",
    "InFlight",
    "LeaseService",
    "LeaseStore",
    "MemoryLeaseStore",
    "Renewal",
]
