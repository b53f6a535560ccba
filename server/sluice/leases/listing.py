"""The leases held now, for operators: a store's tables named by their descriptor and rule,
fullest first, at most ``limit`` of them (with the count of the rest), so a store holding
thousands of tables answers with a page, not all of them.

A table is named by its counter key (``sluice.policies.snapshot.Match.counter_key``): the
domain and the entries, plus a reset's generation when the descriptor was reset. Its rule is
the one the live snapshot matches to those entries now (a table outlives a rule that changed;
``max_leases`` is then the new rule's, or None when no concurrency rule matches any more).
"""

from __future__ import annotations

import asyncio
import heapq
from dataclasses import dataclass

from sluice.leases.store import CounterKey, LeaseStore, StoredTable
from sluice.policies.snapshot import Snapshot

__all__ = ["HeldRow", "LeaseListing", "list_leases"]

Entries = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class HeldRow:
    """One descriptor's leases. ``domain`` and ``entries`` are empty for a table its store
    cannot name (``stored_as`` says where it is); ``rule_id`` is empty and ``max_leases``
    None when no concurrency rule matches it now."""

    domain: str
    entries: Entries
    rule_id: str
    max_leases: int | None
    held: int
    next_expiry_s: float
    last_expiry_s: float
    stored_as: str = ""


@dataclass(frozen=True, slots=True)
class LeaseListing:
    """``rows``: the fullest tables; ``tables`` and ``leases``: how many tables hold leases
    and how many leases they hold, shown or not."""

    rows: tuple[HeldRow, ...]
    tables: int
    leases: int

    @property
    def omitted(self) -> int:
        return self.tables - len(self.rows)


async def list_leases(
    store: LeaseStore, snapshot: Snapshot, *, now: float, domain: str = "", limit: int = 100
) -> LeaseListing:
    """The ``limit`` fullest tables (of ``domain``, or every domain's), ordered by the share of
    their limit held, then by leases held."""
    heap: list[tuple[float, int, int, HeldRow]] = []
    tables = leases = 0
    async for batch in store.list_tables(now=now):
        for stored in batch:
            row = _row(stored, snapshot)
            if domain and row.domain != domain:
                continue
            tables += 1
            leases += row.held
            full = row.held / row.max_leases if row.max_leases else 0.0
            item = (full, row.held, -tables, row)  # -tables: ties keep the order listed
            if len(heap) < limit:
                heapq.heappush(heap, item)
            elif limit:
                heapq.heappushpop(heap, item)
        await asyncio.sleep(0)  # other requests between two batches
    rows = tuple(item[3] for item in sorted(heap, reverse=True))
    return LeaseListing(rows, tables, leases)


def _row(stored: StoredTable, snapshot: Snapshot) -> HeldRow:
    held = stored.held
    named = _descriptor(stored.key) if stored.key is not None else None
    if named is None:
        return HeldRow(
            "", (), "", None, held.count, held.next_expiry_s, held.last_expiry_s, stored.stored_as
        )
    domain, entries = named
    match = snapshot.lookup(domain, entries)
    concurrency = match.concurrency if match is not None else None
    rule_id = match.rule_id if match is not None and concurrency is not None else ""
    return HeldRow(
        domain,
        entries,
        rule_id,
        concurrency.max_leases if concurrency is not None else None,
        held.count,
        held.next_expiry_s,
        held.last_expiry_s,
        stored.stored_as,
    )


def _descriptor(key: CounterKey) -> tuple[str, Entries] | None:
    """(domain, entries) of a counter key: ``(domain, key1, value1, …)``, maybe followed by
    one ``#reset:N`` part (which makes the length even)."""
    parts = key[:-1] if len(key) % 2 == 0 and key and key[-1].startswith("#") else key
    if len(parts) < 3 or len(parts) % 2 == 0:
        return None
    return parts[0], tuple(zip(parts[1::2], parts[2::2], strict=True))
