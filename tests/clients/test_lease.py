"""``client.lease()`` against a real Sluice: on grpc.aio with a stepped clock (expiry without
waiting), and on the default transport (pyvoy) in real time (renewal, a client that dies)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import sluice_client
from sluice_client import AsyncClient, Client, InvalidRequest, SluiceUnavailable
from tests.clients.conftest import SteppedSluice
from tests.support.processes import SluiceProcess

DOMAIN = "clients"


def test_grants_up_to_the_limit_and_says_when_a_slot_frees(
    stepped_sluice: SteppedSluice, unique: str
) -> None:
    job = {"job": unique}
    with Client(stepped_sluice.grpc_target, on_unavailable="raise") as client:
        first = client.lease(DOMAIN, job)
        stepped_sluice.clock.advance(1)
        second = client.lease(DOMAIN, job)
        third = client.lease(DOMAIN, job)
        assert (first.granted, second.granted, third.granted) == (True, True, False)
        assert (second.in_flight, second.max_leases, second.ttl_s) == (2, 2, 3.0)
        assert third.lease_id == "" and not third.held
        assert third.retry_after_s == 2.0  # the first lease expires 2 s from now
        # ShouldRateLimit sees the rule full, and asking takes no lease.
        [status] = client.check(DOMAIN, [job]).statuses
        assert (status.allowed, status.remaining, status.limit.requests_per_unit) == (False, 0, 2)
        assert first.release() and not first.release()
        assert client.check(DOMAIN, [job]).statuses[0].remaining == 1
        second.release()


def test_a_lease_left_unrenewed_expires_on_sluices_clock(
    stepped_sluice: SteppedSluice, unique: str
) -> None:
    job = [("job", unique)]
    with Client(stepped_sluice.grpc_target, on_unavailable="raise") as client:
        # Renewing cannot move their expiry while this clock stands still; once it moves
        # past it, Sluice answers the renewals that they are not held.
        held = [client.lease(DOMAIN, job, ttl_s=1) for _ in range(2)]
        assert all(lease.granted for lease in held)
        assert not client.lease(DOMAIN, job).granted
        stepped_sluice.clock.advance(1)  # Sluice's time: both TTLs are over
        again = client.lease(DOMAIN, job)
        assert again.granted and again.in_flight == 1
        # Releasing a lease that expired is a plain no, and changes nothing.
        assert held[0].release() is False
        assert client.check(DOMAIN, [dict(job)]).statuses[0].remaining == 1
        again.release()


def test_a_blocked_descriptor_says_why(stepped_sluice: SteppedSluice) -> None:
    with Client(stepped_sluice.grpc_target, on_unavailable="raise") as client:
        lease = client.lease(DOMAIN, {"job": "blocked"})
        assert (lease.granted, lease.reason, lease.retry_after_s) == (False, "blocked", 0.0)


def test_the_context_manager_releases(stepped_sluice: SteppedSluice, unique: str) -> None:
    with Client(stepped_sluice.grpc_target) as client:
        with client.lease(DOMAIN, {"job": unique}) as lease:
            assert lease.held
            assert client.check(DOMAIN, [{"job": unique}]).statuses[0].remaining == 1
        assert not lease.held
        assert client.check(DOMAIN, [{"job": unique}]).statuses[0].remaining == 2


def test_async_lease_await_and_async_with(stepped_sluice: SteppedSluice, unique: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(stepped_sluice.grpc_target, on_unavailable="raise") as client:
            lease = await client.lease(DOMAIN, {"job": unique})
            async with client.lease(DOMAIN, {"job": unique}) as second:
                assert lease.held and second.held and second.in_flight == 2
                assert not (await client.lease(DOMAIN, {"job": unique})).granted
            assert not second.held
            assert await lease.release()
            assert not await lease.release()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("entries", "ttl_s", "message"),
    [
        ({}, None, "entries: must not be empty"),
        ("job=x", None, r"entries: must be a mapping or a list of \(key, value\) pairs"),
        ([("job",)], None, r"entries\[0\]: must be a \(key, value\) pair"),
        ({"": "x"}, None, r"entries\[0\].key: must be a non-empty string"),
        ({"job": 3}, None, r"entries\[0\].value: must be a string"),
        ({"job": "x"}, 0, "ttl_s: must be a number > 0"),
        ({"job": "x"}, True, "ttl_s: must be a number > 0"),
        ({"job": "x"}, "5", "ttl_s: must be a number > 0"),
    ],
)
def test_bad_arguments_are_refused_before_sending(
    unreachable_target: str, entries: object, ttl_s: object, message: str
) -> None:
    with Client(unreachable_target) as client, pytest.raises(InvalidRequest, match=message):
        client.lease(DOMAIN, entries, ttl_s=ttl_s)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("domain", "entries", "ttl_s", "message"),
    [
        ("nowhere", {"job": "x"}, None, "domain: no policy for domain 'nowhere'"),
        (DOMAIN, {"user": "x"}, None, "no concurrency rule of domain 'clients' matches user=x"),
        (DOMAIN, {"job": "x"}, 4, "ttl: must be more than 0 and at most the rule's lease_ttl"),
    ],
)
def test_what_sluice_refuses_is_an_invalid_request(
    stepped_sluice: SteppedSluice,
    domain: str,
    entries: dict[str, str],
    ttl_s: float | None,
    message: str,
) -> None:
    with Client(stepped_sluice.grpc_target) as client, pytest.raises(InvalidRequest, match=message):
        client.lease(domain, entries, ttl_s=ttl_s)


def test_an_unreachable_sluice_follows_on_unavailable(unreachable_target: str) -> None:
    with Client(unreachable_target, on_unavailable="allow") as client:
        lease = client.lease(DOMAIN, {"job": "x"})
        assert lease.granted and lease.degraded and not lease.held
        assert lease.release() is False
    with Client(unreachable_target, on_unavailable="deny") as client:
        lease = client.lease(DOMAIN, {"job": "x"})
        assert not lease.granted and lease.degraded
    with Client(unreachable_target, on_unavailable="raise") as client:
        with pytest.raises(SluiceUnavailable, match="UNAVAILABLE"):
            client.lease(DOMAIN, {"job": "x"})


def _wait_for(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_a_held_lease_is_renewed_past_its_ttl(sluice: SluiceProcess, unique: str) -> None:
    """Real time on the default transport: a 0.3 s lease renewed every 0.1 s stays held."""
    with Client(sluice.grpc_target, on_unavailable="raise", timeout_s=2) as client:
        lease = client.lease(DOMAIN, {"job": unique}, ttl_s=0.3)
        started = time.monotonic()
        assert lease.granted
        assert _wait_for(lambda: lease.renewals >= 6, timeout_s=10)
        assert time.monotonic() - started > 0.3  # past the TTL the acquire gave it
        assert lease.held
        assert client.check(DOMAIN, [{"job": unique}]).statuses[0].remaining == 1
        assert lease.release()
        assert client.check(DOMAIN, [{"job": unique}]).statuses[0].remaining == 2


def test_an_async_lease_is_renewed_too(sluice: SluiceProcess, unique: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(sluice.grpc_target, on_unavailable="raise", timeout_s=2) as client:
            async with client.lease(DOMAIN, {"job": unique}, ttl_s=0.3) as lease:
                while lease.renewals < 6:
                    await asyncio.sleep(0.02)
                assert lease.held
                [status] = (await client.check(DOMAIN, [{"job": unique}])).statuses
                assert status.remaining == 1
            [status] = (await client.check(DOMAIN, [{"job": unique}])).statuses
            assert status.remaining == 2

    asyncio.run(asyncio.wait_for(scenario(), 20))


def test_a_client_that_dies_holding_leases_frees_them_after_the_ttl(
    sluice: SluiceProcess, unique: str
) -> None:
    holder = textwrap.dedent(
        f"""
        import sys, time
        from sluice_client import Client
        client = Client({sluice.grpc_target!r}, on_unavailable="raise", timeout_s=2)
        leases = [client.lease({DOMAIN!r}, {{"job": {unique!r}}}, ttl_s=1) for _ in range(2)]
        assert all(lease.held for lease in leases)
        print("held", flush=True)
        time.sleep(3600)
        """
    )
    client_source = str(Path(sluice_client.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": client_source}
    process = subprocess.Popen(
        [sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "held\n"
    finally:
        process.kill()  # SIGKILL: no release, no renewal from now on
        process.wait()
    killed = time.monotonic()
    with Client(sluice.grpc_target, on_unavailable="raise", timeout_s=2) as client:
        refused = client.lease(DOMAIN, {"job": unique})
        assert not refused.granted and 0 < refused.retry_after_s <= 1
        waited: list[float] = []

        def granted() -> bool:
            lease = client.lease(DOMAIN, {"job": unique})
            if lease.granted:
                waited.append(time.monotonic() - killed)
                lease.release()
            return lease.granted

        assert _wait_for(granted, timeout_s=10)
        assert waited[0] <= 1 + 2  # within the TTL (plus the machine's slack)
