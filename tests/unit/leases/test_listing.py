"""list_leases: a store's tables named by descriptor and rule, fullest first, bounded."""

from __future__ import annotations

import asyncio

from sluice.clock import ManualClock
from sluice.leases import LeaseService, MemoryLeaseStore
from sluice.leases.listing import HeldRow, list_leases
from sluice.leases.store import StoredTable
from sluice.leases.table import Held
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text

POLICY = """\
domain: jobs
descriptors:
  - key: tenant
    rate_limit: {concurrency: 4, lease_ttl: 10s}
  - key: batch
    value: "night*"
    share_threshold: true
    rate_limit: {concurrency: 2, lease_ttl: 30s}
---
domain: other
descriptors:
  - key: tenant
    rate_limit: {concurrency: 1, lease_ttl: 5s}
"""


async def _take(service: LeaseService, domain: str, key: str, value: str, n: int) -> None:
    for _ in range(n):
        assert (await service.acquire(domain, ((key, value),))).granted


def test_rows_name_the_descriptor_and_its_rule_fullest_first() -> None:
    async def scenario() -> None:
        clock = ManualClock(1000)
        snapshot = Snapshot(load_text(POLICY))
        store = MemoryLeaseStore()
        service = LeaseService(lambda: snapshot, store, clock)
        await _take(service, "jobs", "tenant", "acme", 1)
        clock.advance(2)
        await _take(service, "jobs", "tenant", "acme", 2)  # 3 of 4
        await _take(service, "jobs", "tenant", "zed", 1)  # 1 of 4
        await _take(service, "jobs", "batch", "nightly-7", 2)  # 2 of 2: the shared counter
        await _take(service, "other", "tenant", "acme", 1)
        clock.advance(1)
        listing = await list_leases(store, snapshot, now=clock.now(), domain="jobs")
        assert listing.rows == (
            HeldRow("jobs", (("batch", "night*"),), "jobs.batch_night*", 2, 2, 29.0, 29.0),
            HeldRow("jobs", (("tenant", "acme"),), "jobs.tenant", 4, 3, 7.0, 9.0),
            HeldRow("jobs", (("tenant", "zed"),), "jobs.tenant", 4, 1, 9.0, 9.0),
        )
        assert (listing.tables, listing.leases, listing.omitted) == (3, 6, 0)
        # Every domain's, at most two: the rest counted, not listed.
        everything = await list_leases(store, snapshot, now=clock.now(), limit=2)
        assert [(r.domain, r.entries[0][1], r.held) for r in everything.rows] == [
            ("jobs", "night*", 2),
            ("other", "acme", 1),  # 1 of 1: as full as the batch
        ]
        assert (everything.tables, everything.leases, everything.omitted) == (4, 7, 2)
        clock.advance(10)  # the tenants' 10 s leases are over
        later = await list_leases(store, snapshot, now=clock.now(), domain="jobs")
        assert [(r.entries, r.held) for r in later.rows] == [((("batch", "night*"),), 2)]

    asyncio.run(scenario())


def test_a_table_whose_rule_is_gone_or_unnamed_is_still_listed() -> None:
    class Listed:
        """A store holding the tables the snapshot no longer explains."""

        async def list_tables(self, *, now: float):  # type: ignore[no-untyped-def]
            yield [
                StoredTable(("jobs", "region", "eu"), Held(2, 1.0, 3.0)),  # no such rule now
                StoredTable(("jobs", "tenant", "acme", "#reset:2"), Held(1, 4.0, 4.0)),
                StoredTable(None, Held(5, 2.0, 8.0), "sluice:{#3f2a}:lease"),
            ]

    async def scenario() -> None:
        snapshot = Snapshot(load_text(POLICY))
        listing = await list_leases(Listed(), snapshot, now=0)  # type: ignore[arg-type]
        assert listing.rows == (
            HeldRow("jobs", (("tenant", "acme"),), "jobs.tenant", 4, 1, 4.0, 4.0),
            HeldRow("", (), "", None, 5, 2.0, 8.0, "sluice:{#3f2a}:lease"),
            HeldRow("jobs", (("region", "eu"),), "", None, 2, 1.0, 3.0),
        )

    asyncio.run(scenario())
