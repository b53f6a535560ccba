"""The lease table of one descriptor: grant up to the limit, expire by time, release once."""

from __future__ import annotations

from sluice.leases import table
from sluice.leases.table import Acquired, Held, InFlight


def test_grants_up_to_the_limit_then_says_when_a_slot_frees() -> None:
    leases: dict[str, float] = {}
    assert table.acquire(leases, "a", max_leases=2, ttl_s=10, now=100) == Acquired(True, 1)
    assert table.acquire(leases, "b", max_leases=2, ttl_s=10, now=104) == Acquired(True, 2)
    assert table.acquire(leases, "c", max_leases=2, ttl_s=10, now=105) == Acquired(False, 2, 5.0)
    assert leases == {"a": 110, "b": 114}


def test_a_lease_expires_at_its_ttl_and_frees_its_slot() -> None:
    leases: dict[str, float] = {}
    table.acquire(leases, "a", max_leases=1, ttl_s=10, now=100)
    assert table.in_flight(leases, now=109.5) == InFlight(1, 0.5)
    # Held while now < expires_at: at 110 it is gone, without anyone releasing it.
    assert table.in_flight(leases, now=110) == InFlight(0)
    assert table.acquire(leases, "b", max_leases=1, ttl_s=10, now=110) == Acquired(True, 1)


def test_renew_extends_a_held_lease_but_never_revives_an_expired_one() -> None:
    leases: dict[str, float] = {}
    table.acquire(leases, "a", max_leases=1, ttl_s=10, now=100)
    assert table.renew(leases, "a", ttl_s=10, now=108)
    assert table.in_flight(leases, now=117) == InFlight(1, 1.0)
    assert not table.renew(leases, "a", ttl_s=10, now=118)  # expired at 118
    assert not table.renew(leases, "unknown", ttl_s=10, now=118)
    assert leases == {}


def test_release_answers_whether_the_lease_was_held() -> None:
    leases: dict[str, float] = {}
    table.acquire(leases, "a", max_leases=1, ttl_s=10, now=100)
    table.acquire(leases, "b", max_leases=2, ttl_s=1, now=100)
    assert table.release(leases, "a", now=101)
    assert not table.release(leases, "a", now=101)  # released already
    assert not table.release(leases, "b", now=101)  # expired at 101
    assert not table.release(leases, "never", now=101)
    assert leases == {}


def test_a_limit_of_zero_never_grants_and_has_nothing_to_wait_for() -> None:
    assert table.acquire({}, "a", max_leases=0, ttl_s=10, now=0) == Acquired(False, 0, 0.0)


def test_held_says_when_the_first_and_the_last_lease_expire() -> None:
    leases: dict[str, float] = {}
    table.acquire(leases, "a", max_leases=3, ttl_s=10, now=100)
    table.acquire(leases, "b", max_leases=3, ttl_s=10, now=104)
    assert table.held(leases, now=105) == Held(2, 5.0, 9.0)
    assert table.held(leases, now=110) == Held(1, 4.0, 4.0)
    assert table.held(leases, now=114) == Held(0)
