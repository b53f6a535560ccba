"""LeaseService: leases for the descriptors of concurrency rules, on an injected clock."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from sluice.clock import ManualClock
from sluice.errors import DomainNotFoundError, InvalidRequestError, NoConcurrencyRuleError
from sluice.leases import Grant, LeaseService, MemoryLeaseStore, Renewal
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text

POLICY = """\
domain: jobs
descriptors:
  - key: tenant
    rate_limit: {concurrency: 2, lease_ttl: 10s}
  - key: plan
    rate_limit: {unit: minute, requests_per_unit: 5}
"""
ACME = (("tenant", "acme"),)


def service(clock: ManualClock) -> LeaseService:
    snapshot = Snapshot(load_text(POLICY, "p.yaml"))
    ids = (f"lease-{n}" for n in itertools.count(1))
    return LeaseService(lambda: snapshot, MemoryLeaseStore(), clock, new_id=lambda: next(ids))


def test_acquire_grants_up_to_the_limit_per_descriptor() -> None:
    async def scenario() -> None:
        leases = service(ManualClock(1000))
        assert await leases.acquire("jobs", ACME) == Grant(True, "lease-1", 10.0, 2, 1)
        assert await leases.acquire("jobs", ACME) == Grant(True, "lease-2", 10.0, 2, 2)
        assert await leases.acquire("jobs", ACME) == Grant(False, "", 10.0, 2, 2, 10.0)
        other = await leases.acquire("jobs", (("tenant", "other"),))
        assert other.granted and other.in_flight == 1

    asyncio.run(scenario())


def test_a_client_that_dies_holding_leases_frees_them_after_the_ttl() -> None:
    async def scenario() -> None:
        clock = ManualClock(1000)
        leases = service(clock)
        await leases.acquire("jobs", ACME)
        await leases.acquire("jobs", ACME, ttl_s=4)  # a shorter TTL than the rule's
        clock.advance(4)
        assert (await leases.acquire("jobs", ACME)).granted  # the 4 s lease is gone
        assert not (await leases.acquire("jobs", ACME)).granted
        clock.advance(6)  # the first lease (10 s) expires too
        assert (await leases.acquire("jobs", ACME)).in_flight == 2

    asyncio.run(scenario())


def test_renew_keeps_a_lease_past_its_ttl_and_release_frees_it_once() -> None:
    async def scenario() -> None:
        clock = ManualClock(1000)
        leases = service(clock)
        grant = await leases.acquire("jobs", ACME)
        clock.advance(9)
        assert await leases.renew("jobs", ACME, grant.lease_id) == Renewal(True, 10.0)
        clock.advance(9)  # 18 s after the acquire: held thanks to the renewal
        assert await leases.release("jobs", ACME, grant.lease_id)
        assert not await leases.release("jobs", ACME, grant.lease_id)

    asyncio.run(scenario())


def test_release_or_renew_of_an_unknown_or_expired_lease_is_a_plain_no() -> None:
    async def scenario() -> None:
        clock = ManualClock(1000)
        leases = service(clock)
        grant = await leases.acquire("jobs", ACME)
        assert not await leases.release("jobs", ACME, "never-granted")
        clock.advance(10)
        assert await leases.renew("jobs", ACME, grant.lease_id) == Renewal(False, 10.0)
        assert not await leases.release("jobs", ACME, grant.lease_id)
        # Nothing changed: both slots are free.
        assert (await leases.acquire("jobs", ACME)).in_flight == 1

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (("", ACME), InvalidRequestError, "domain: must not be empty"),
        (("jobs", ()), InvalidRequestError, "entries: must not be empty"),
        (("jobs", (("", "x"),)), InvalidRequestError, "entries[0].key: must not be empty"),
        (
            ("jobs", (("tenant", "x" * 1025),)),
            InvalidRequestError,
            "entries[0].value: 1025 characters, more than the maximum of 1024",
        ),
        (
            ("jobs", tuple(("k", "v") for _ in range(17))),
            InvalidRequestError,
            "entries: 17 entries, more than the maximum of 16",
        ),
        (("shop", ACME), DomainNotFoundError, "domain: no policy for domain 'shop'"),
        (
            ("jobs", (("plan", "pro"),)),
            NoConcurrencyRuleError,
            "entries: no concurrency rule of domain 'jobs' matches plan=pro",
        ),
        (
            ("jobs", (("nothing", "here"),)),
            NoConcurrencyRuleError,
            "entries: no concurrency rule of domain 'jobs' matches nothing=here",
        ),
    ],
)
def test_bad_descriptors_are_refused_by_field(
    call: tuple[str, tuple[tuple[str, str], ...]], error: type[Exception], message: str
) -> None:
    leases = service(ManualClock(0))
    for method in (
        lambda: leases.acquire(*call),
        lambda: leases.renew(*call, "lease-1"),
        lambda: leases.release(*call, "lease-1"),
    ):
        with pytest.raises(error) as raised:
            asyncio.run(method())
        assert str(raised.value) == message


@pytest.mark.parametrize(
    ("ttl_s", "message"),
    [
        (11, "ttl: must be more than 0 and at most the rule's lease_ttl of 10s, not 11s"),
        (-1, "ttl: must be more than 0 and at most the rule's lease_ttl of 10s, not -1s"),
    ],
)
def test_a_ttl_beyond_the_rules_is_refused(ttl_s: float, message: str) -> None:
    leases = service(ManualClock(0))
    with pytest.raises(InvalidRequestError, match=f"^{message}$"):
        asyncio.run(leases.acquire("jobs", ACME, ttl_s=ttl_s))
    with pytest.raises(InvalidRequestError, match=f"^{message}$"):
        asyncio.run(leases.renew("jobs", ACME, "lease-1", ttl_s=ttl_s))


@pytest.mark.parametrize(
    ("lease_id", "message"),
    [("", "lease_id: must not be empty"), ("x" * 65, "lease_id: 65 characters, more than 64")],
)
def test_a_bad_lease_id_is_refused(lease_id: str, message: str) -> None:
    leases = service(ManualClock(0))
    with pytest.raises(InvalidRequestError, match=f"^{message}$"):
        asyncio.run(leases.release("jobs", ACME, lease_id))
    with pytest.raises(InvalidRequestError, match=f"^{message}$"):
        asyncio.run(leases.renew("jobs", ACME, lease_id))


def test_a_shadow_mode_rule_grants_past_its_limit_and_shows_by_how_much() -> None:
    shadow = "domain: jobs\ndescriptors:\n  - key: tenant\n    shadow_mode: true\n"
    shadow += "    rate_limit: {concurrency: 1}\n"
    snapshot = Snapshot(load_text(shadow, "p.yaml"))
    leases = LeaseService(lambda: snapshot, MemoryLeaseStore(), ManualClock(0))

    async def scenario() -> list[Grant]:
        return [await leases.acquire("jobs", ACME) for _ in range(3)]

    grants = asyncio.run(scenario())
    assert [(g.granted, g.max_leases, g.in_flight) for g in grants] == [
        (True, 1, 1),
        (True, 1, 2),
        (True, 1, 3),
    ]


def test_a_blocked_descriptor_gets_no_lease_until_the_block_ends() -> None:
    blocked = POLICY + (
        "blocks:\n"
        "  - {descriptor: tenant=evil, expires_at: 2026-01-01T00:01:00Z}\n"
        "  - {descriptor: tenant=worse}\n"
    )
    snapshot = Snapshot(load_text(blocked, "p.yaml"))
    clock = ManualClock(1767225600.0)  # 2026-01-01T00:00:00Z
    leases = LeaseService(lambda: snapshot, MemoryLeaseStore(), clock, new_id=lambda: "lease-1")

    async def scenario() -> None:
        evil, worse = (("tenant", "evil"),), (("tenant", "worse"),)
        assert await leases.acquire("jobs", evil) == Grant(False, "", 10.0, 2, 0, 60.0, "blocked")
        assert await leases.acquire("jobs", worse) == Grant(False, "", 10.0, 2, 0, 0.0, "blocked")
        clock.advance(60)  # the block on evil is over
        assert await leases.acquire("jobs", evil) == Grant(True, "lease-1", 10.0, 2, 1)

    asyncio.run(scenario())
