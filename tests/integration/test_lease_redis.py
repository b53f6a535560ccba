"""RedisLeaseStore against real standalone, Sentinel and Cluster deployments: the same
answers (and the same tables listed) as the pure lease table for random operation sequences,
keys that expire with their last lease, and Redis's own clock by default."""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from sluice.backends.redis.connect import connect
from sluice.leases import MemoryLeaseStore
from sluice.leases.redis import RedisLeaseStore
from sluice.leases.store import LeaseStore
from tests.integration.redis_support import data_nodes, scan_keys


@pytest.fixture(params=["standalone", "sentinel", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    fixture = {"standalone": "redis_server", "sentinel": "redis_sentinel"}
    return request.getfixturevalue(fixture.get(request.param, "redis_cluster"))


@pytest.fixture
def prefix() -> str:
    return f"l{uuid.uuid4().hex[:8]}:"


def store(url: str, prefix: str, *, server_time: bool = False) -> RedisLeaseStore:
    return RedisLeaseStore(connect(url, timeout_s=2), key_prefix=prefix, server_time=server_time)


async def listed(leases: LeaseStore, now: float) -> set[object]:
    return {(t.key, t.held) async for batch in leases.list_tables(now=now) for t in batch}


def test_answers_match_the_lease_table(url: str, prefix: str) -> None:
    async def scenario() -> None:
        redis_store, memory = store(url, prefix), MemoryLeaseStore()
        rng = random.Random(11)
        keys = [("jobs", "tenant", name) for name in ("a", "b", "{c}:d", "é")]
        ids: list[str] = []
        now = 1_700_000_000.0
        try:
            for step in range(400):
                now += rng.choice((0.0, 0.25, 0.5, 1.0, 3.0))
                key = rng.choice(keys)
                op = rng.choice(("acquire", "acquire", "renew", "release", "in_flight"))
                if op == "acquire":
                    lease_id = f"id{step}"
                    ids.append(lease_id)
                    kwargs = {"max_leases": rng.randint(0, 3), "ttl_s": rng.choice((1, 2.5, 5))}
                    got = await redis_store.acquire(key, lease_id, now=now, **kwargs)
                    want = await memory.acquire(key, lease_id, now=now, **kwargs)
                elif op == "renew" and ids:
                    lease_id, ttl = rng.choice(ids), rng.choice((1.0, 4.0))
                    got = await redis_store.renew(key, lease_id, ttl_s=ttl, now=now)
                    want = await memory.renew(key, lease_id, ttl_s=ttl, now=now)
                elif op == "release" and ids:
                    lease_id = rng.choice(ids)
                    got = await redis_store.release(key, lease_id, now=now)
                    want = await memory.release(key, lease_id, now=now)
                else:  # and what an operator's listing reads, named back from Redis's keys
                    got = (
                        await redis_store.in_flight(keys, now=now),
                        await listed(redis_store, now),
                    )
                    want = (await memory.in_flight(keys, now=now), await listed(memory, now))
                assert got == want, (step, op, key)
        finally:
            await redis_store.close()

    asyncio.run(scenario())


def test_the_key_lives_as_long_as_its_last_lease(url: str, prefix: str) -> None:
    async def scenario() -> None:
        leases = store(url, prefix, server_time=True)
        key = ("jobs", "tenant", "acme")
        try:
            await leases.acquire(key, "short", max_leases=5, ttl_s=2, now=0)
            await leases.acquire(key, "long", max_leases=5, ttl_s=60, now=0)
            [(node, name)] = scan_keys(data_nodes(url), f"{prefix}*")
            assert name == leases.key(key).encode()
            # The last lease's 60 s plus a second of slack, on Redis's clock.
            assert 60_000 < node.pttl(name) <= 61_000
            assert await leases.release(key, "long", now=0)
            assert await leases.release(key, "short", now=0)
            assert scan_keys(data_nodes(url), f"{prefix}*") == []  # gone with its last lease
        finally:
            await leases.close()

    asyncio.run(scenario())


def test_server_time_ignores_the_callers_clock(url: str, prefix: str) -> None:
    async def scenario() -> None:
        leases = store(url, prefix, server_time=True)
        key = ("jobs", "tenant", "acme")
        try:
            assert (await leases.acquire(key, "a", max_leases=1, ttl_s=30, now=0)).granted
            # A caller whose clock is far ahead cannot expire a lease Redis still holds.
            refused = await leases.acquire(key, "b", max_leases=1, ttl_s=30, now=1e12)
            assert not refused.granted and 29 < refused.retry_after_s <= 30
        finally:
            await leases.close()

    asyncio.run(scenario())


def test_an_unreachable_redis_is_backend_unavailable(prefix: str) -> None:
    from sluice.errors import BackendUnavailableError

    async def scenario() -> None:
        leases = RedisLeaseStore(connect("redis://127.0.0.1:1", timeout_s=0.2), key_prefix=prefix)
        try:
            with pytest.raises(BackendUnavailableError, match="^Redis: "):
                await leases.acquire(("d", "k", "v"), "a", max_leases=1, ttl_s=1, now=0)
            with pytest.raises(BackendUnavailableError, match="^Redis: "):  # listing too
                await listed(leases, 0)
        finally:
            await leases.close()

    asyncio.run(scenario())


def test_a_hung_redis_opens_the_breaker_and_calls_fail_fast_until_a_probe_succeeds(
    redis_server: str, prefix: str
) -> None:
    from sluice.backends.redis.breaker import CircuitBreaker
    from sluice.clock import ManualClock
    from sluice.errors import BackendUnavailableError
    from tests.support.holding_proxy import HoldingProxy

    host, port = redis_server.removeprefix("redis://").split("/")[0].split(":")
    proxy = HoldingProxy(host, int(port))
    clock = ManualClock(0)
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=5, clock=clock.now)
    key = ("d", "k", "v")

    async def scenario() -> None:
        leases = RedisLeaseStore(
            connect(f"redis://127.0.0.1:{proxy.port}", timeout_s=0.2),
            key_prefix=prefix,
            breaker=breaker,
        )
        try:
            assert (await leases.acquire(key, "a", max_leases=2, ttl_s=60, now=0)).granted
            proxy.hold()
            for _ in range(3):  # each waits out the client's timeout
                with pytest.raises(BackendUnavailableError, match="^Redis: .*Timeout"):
                    await leases.acquire(key, "b", max_leases=2, ttl_s=60, now=0)
            assert breaker.state == "open"
            sent = proxy.held_bytes
            with pytest.raises(BackendUnavailableError, match=r"circuit open"):
                await leases.acquire(key, "b", max_leases=2, ttl_s=60, now=0)
            assert proxy.held_bytes == sent  # failed without a byte on the network
            proxy.release()
            clock.advance(5)  # the cool-down: the next call is the probe
            assert await leases.release(key, "a", now=0)
            assert breaker.state == "closed"
            assert (await leases.acquire(key, "b", max_leases=2, ttl_s=60, now=0)).granted
        finally:
            await leases.close()
            proxy.close()

    asyncio.run(scenario())
