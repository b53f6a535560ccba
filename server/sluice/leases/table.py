"""The lease table of one descriptor, as pure functions over ``{lease_id: expires_at_s}``.

A lease is held while ``now < expires_at_s``: it expires by itself, so a client that dies
holding one frees its slot after the lease's TTL, and no sweeper is needed (each operation
drops the expired leases of the table it touches first). ``lua/`` mirrors every function
here operation for operation on a Redis sorted set scored by expiry; the memory store runs
these directly.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Acquired",
    "Held",
    "InFlight",
    "acquire",
    "held",
    "in_flight",
    "prune",
    "release",
    "renew",
]


@dataclass(frozen=True, slots=True)
class Acquired:
    """What an acquire did: ``granted`` or not, the leases held afterwards (``in_flight``),
    and, when refused, ``retry_after_s`` until the first held lease expires (0: none held,
    so it will never be granted: the limit is 0)."""

    granted: bool
    in_flight: int
    retry_after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class InFlight:
    """The leases held now, and how long until the first of them expires (0: none held)."""

    count: int
    next_expiry_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Held:
    """The leases held now, for an operator: how many, and how long until the first and the
    last of them expire (0: none held)."""

    count: int
    next_expiry_s: float = 0.0
    last_expiry_s: float = 0.0


def prune(table: dict[str, float], now: float) -> None:
    """Drop the expired leases (``expires_at_s <= now``)."""
    expired = [lease_id for lease_id, expires in table.items() if expires <= now]
    for lease_id in expired:
        del table[lease_id]


def _next_expiry(table: dict[str, float], now: float) -> float:
    return min(table.values()) - now if table else 0.0


def acquire(
    table: dict[str, float], lease_id: str, *, max_leases: int, ttl_s: float, now: float
) -> Acquired:
    """Take a lease if fewer than ``max_leases`` are held."""
    prune(table, now)
    if len(table) >= max_leases:
        return Acquired(False, len(table), _next_expiry(table, now))
    table[lease_id] = now + ttl_s
    return Acquired(True, len(table))


def renew(table: dict[str, float], lease_id: str, *, ttl_s: float, now: float) -> bool:
    """Extend a held lease to ``now + ttl_s``; False if it is not held (unknown, released or
    expired: an expired lease is not revived, its slot may be someone else's now)."""
    prune(table, now)
    if lease_id not in table:
        return False
    table[lease_id] = now + ttl_s
    return True


def release(table: dict[str, float], lease_id: str, *, now: float) -> bool:
    """Give a lease back; False if it was not held (unknown, released already, or expired)."""
    prune(table, now)
    return table.pop(lease_id, None) is not None


def in_flight(table: dict[str, float], *, now: float) -> InFlight:
    prune(table, now)
    return InFlight(len(table), _next_expiry(table, now))


def held(table: dict[str, float], *, now: float) -> Held:
    prune(table, now)
    if not table:
        return Held(0)
    return Held(len(table), min(table.values()) - now, max(table.values()) - now)
