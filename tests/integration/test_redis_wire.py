"""The lean client path (``sluice.backends.redis.wire``) against real redis-servers: it is the
one the backend takes for standalone and Sentinel, it survives restarts and SCRIPT FLUSH,
turns hangs into BackendUnavailableError within its timeout, authenticates and selects the
DB the URL names, and decides exactly under concurrency."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis

from sluice.algorithms import ALGORITHMS, Limit
from sluice.app import make_backend
from sluice.backends import Hit
from sluice.backends.redis.backend import RedisBackend
from sluice.backends.redis.connect import connect
from sluice.backends.redis.scripts import (
    SCRIPT_SOURCE,
    decode_result,
    encode_args,
    encode_command,
    encode_compact_args,
)
from sluice.errors import BackendUnavailableError
from sluice.settings import Settings
from tests.support.redis_servers import RedisProcess

WINDOW = Limit(50, 3600, ALGORITHMS["fixed_window"])


def hit(name: str, limit: Limit = WINDOW, cost: int = 1) -> Hit:
    return Hit(("d", "user", name), (limit,), cost)


def lean_backend(url: str, **kwargs: object) -> RedisBackend:
    timeout_s = kwargs.pop("timeout_s", 2)
    backend = RedisBackend(
        connect(url, timeout_s=timeout_s),  # type: ignore[arg-type]
        key_prefix=f"w{uuid.uuid4().hex[:8]}:",
        **kwargs,  # type: ignore[arg-type]
    )
    assert backend.lean_connection is not None, "the lean path serves this URL"
    return backend


async def allowed(backend: RedisBackend, name: str) -> bool:
    [outcomes] = await backend.apply([hit(name)], time.time())
    return outcomes[0].allowed


def test_the_lean_path_serves_standalone_and_sentinel_not_cluster(
    redis_server: str, redis_sentinel: str, redis_cluster: str
) -> None:
    async def scenario() -> None:
        for url in (redis_server, redis_sentinel):
            backend = lean_backend(url)
            assert await allowed(backend, "a")
            assert backend.lean_connection is not None
            assert backend.lean_connection.connects == 1
            await backend.close()
        cluster = RedisBackend(connect(redis_cluster, timeout_s=2))
        assert cluster.lean_connection is None
        await cluster.close()

    asyncio.run(scenario())


def test_the_command_bytes_are_the_script_arguments() -> None:
    gcra = Limit(7, 60, ALGORITHMS["gcra"], 3)
    hits = [hit("a", cost=2), Hit(("d", "x"), (WINDOW, gcra), 0)]
    keys = ["k1", "k2", "k3"]
    for now in (None, 1_700_000_000.125):
        payload, nargs = encode_command(keys, hits, now)
        args = [str(len(keys)), *keys, *encode_compact_args(hits, now)]
        assert nargs == len(args)
        assert payload == b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)


def test_reconnects_after_redis_restarts(private_redis: RedisProcess) -> None:
    backend = lean_backend(private_redis.url)
    assert backend.lean_connection is not None

    async def scenario() -> None:
        assert await allowed(backend, "a")
        private_redis.kill()
        with pytest.raises(BackendUnavailableError, match="ConnectionError"):
            await allowed(backend, "a")
        private_redis.start()
        # A new server: no connection, no script; the next call connects and loads it.
        assert await allowed(backend, "a")
        assert backend.lean_connection.connects == 2
        assert backend.lean_connection.script_loads == 2
        await backend.close()

    asyncio.run(scenario())


def test_noscript_after_script_flush_loads_and_retries(private_redis: RedisProcess) -> None:
    backend = lean_backend(private_redis.url)
    assert backend.lean_connection is not None
    admin = private_redis.client()

    async def scenario() -> None:
        for _ in range(3):
            assert await allowed(backend, "a")
        loads = backend.lean_connection.script_loads
        admin.script_flush()
        [outcomes] = await backend.apply([hit("a")], time.time())
        assert outcomes[0].allowed and outcomes[0].remaining == 50 - 4  # counted once
        assert backend.lean_connection.script_loads == loads + 1
        assert backend.lean_connection.connects == 1  # the same connection throughout
        await backend.close()

    asyncio.run(scenario())
    admin.close()


def test_a_hung_redis_is_a_timeout_then_recovers(private_redis: RedisProcess) -> None:
    timeout_s = 0.2
    backend = lean_backend(private_redis.url, timeout_s=timeout_s, answer_timeout_s=10)

    async def scenario() -> None:
        assert await allowed(backend, "a")
        private_redis.freeze()
        try:
            start = time.perf_counter()
            results = await asyncio.gather(
                *(allowed(backend, "a") for _ in range(20)), return_exceptions=True
            )
            elapsed = time.perf_counter() - start
        finally:
            private_redis.thaw()
        assert all(isinstance(r, BackendUnavailableError) for r in results), results
        assert "TimeoutError" in str(results[0])
        assert elapsed < 3 * timeout_s + 0.2
        # The timed-out connection was dropped (its replies would be out of step): the next
        # call opens another and decides.
        assert await allowed(backend, "a")
        assert backend.lean_connection is not None
        assert backend.lean_connection.connects == 2
        await backend.close()

    asyncio.run(scenario())


def test_username_password_and_db_come_from_the_url(tmp_path: Path) -> None:
    user = ["sluice", "on", ">wire-canary-5d1", "~*", "&*", "+@all"]
    server = RedisProcess(tmp_path / "redis", args=["--user", *user]).start()
    try:
        good = f"redis://sluice:wire-canary-5d1@127.0.0.1:{server.port}/3"
        bad = f"redis://sluice:wrong@127.0.0.1:{server.port}/3"

        async def scenario() -> None:
            backend = lean_backend(good)
            assert await allowed(backend, "a")
            await backend.close()
            refused = lean_backend(bad)
            with pytest.raises(BackendUnavailableError) as info:
                await allowed(refused, "a")
            assert "wrong" not in str(info.value)
            await refused.close()

        asyncio.run(scenario())
        admin = redis.Redis(port=server.port, db=3)
        assert admin.dbsize() == 1 and redis.Redis(port=server.port, db=0).dbsize() == 0
        admin.close()
    finally:
        server.kill()


def test_200_concurrent_calls_with_limit_50_admit_exactly_50(redis_server: str) -> None:
    # Two backends, as two Sluice processes would be, each with its own connection.
    backends = [lean_backend(redis_server), lean_backend(redis_server)]
    prefix = backends[0]._names.prefix
    backends[1]._names.prefix = prefix  # one counter for both

    async def scenario() -> int:
        results = await asyncio.gather(*(allowed(backends[n % 2], "x") for n in range(200)))
        for backend in backends:
            await backend.close()
        return sum(results)

    assert asyncio.run(scenario()) == 50


@pytest.mark.parametrize("client", ["lean", "redis-py"])
def test_redis_client_setting_picks_the_path(redis_server: str, client: str) -> None:
    settings = Settings(
        backend="redis", redis_url=redis_server, redis_client=client, local_cache=False
    )
    backend = make_backend(settings)
    assert isinstance(backend, RedisBackend)
    assert (backend.lean_connection is not None) is (client == "lean")

    async def scenario() -> None:
        assert await allowed(backend, uuid.uuid4().hex)
        await backend.close()

    asyncio.run(scenario())


def test_pipelined_calls_get_their_own_replies(redis_server: str) -> None:
    # One request per script call and 8 calls in flight on the one connection: each reply
    # must reach the call it answers. Counter k has limit 100 * (k + 1), so a reply routed to
    # the wrong caller shows as a remaining count outside its counter's range.
    backend = lean_backend(redis_server, max_in_flight=8, max_batch_hits=1)
    counters = 20

    async def one(n: int) -> tuple[int, int]:
        k = n % counters
        limit = Limit(100 * (k + 1), 3600, ALGORITHMS["fixed_window"])
        [outcomes] = await backend.apply([Hit(("p", str(k)), (limit,), 1)], time.time())
        return k, outcomes[0].remaining

    async def scenario() -> list[tuple[int, int]]:
        results = await asyncio.gather(*(one(n) for n in range(400)))
        assert backend.lean_connection is not None
        assert backend.lean_connection.connects == 1
        assert backend.script_calls >= 400 / 8
        await backend.close()
        return results

    results = asyncio.run(scenario())
    for k in range(counters):
        seen = sorted(remaining for counter, remaining in results if counter == k)
        assert seen == list(range(100 * (k + 1) - 20, 100 * (k + 1)))


def test_both_argument_forms_decide_alike(redis_server: str) -> None:
    # The compact form (each distinct limit once, hits naming them by index) that both
    # client paths send, against the per-hit form, on twin keys: the same outcomes.
    rules = [
        (WINDOW,),
        (Limit(3, 10, ALGORITHMS["gcra"], 2), WINDOW),
        (Limit(4, 10, ALGORITHMS["sliding_window_counter"]),),
        (WINDOW, Limit(2, 60, ALGORITHMS["token_bucket"], 2)),
    ]
    client = redis.Redis.from_url(redis_server)
    script = client.register_script(SCRIPT_SOURCE)
    run = uuid.uuid4().hex
    now = 1_700_000_000.5
    for step in range(40):
        hits = [Hit(("f", str(n % 3)), rules[(step + n) % len(rules)], n % 2 + 1) for n in range(5)]
        results = []
        for form, encode in (("per-hit", encode_args), ("compact", encode_compact_args)):
            keys = [
                f"{run}:{form}:{hit.counter_key[1]}:{limit.algorithm.name}:{limit.period_s}"
                for hit in hits
                for limit in hit.limits
            ]
            raw = script(keys=keys, args=encode(hits, now + step * 0.7))
            results.append(decode_result(raw, hits))
        assert results[0] == results[1]
    with pytest.raises(redis.ResponseError, match="bad limit index"):
        script(keys=["k"], args=["1", "#", "1", "fixed_window", "5", "1", "0", "1", "1", "2"])
    client.close()


def test_a_demoted_master_drops_the_connection(tmp_path: Path) -> None:
    # What a Sentinel failover does to the old master when it comes back: it becomes a
    # replica, and writes get READONLY. The call fails (unavailable), the connection is
    # dropped so that the next call connects again (through Sentinel: to the new master).
    master = RedisProcess(tmp_path / "master").start()
    server = RedisProcess(tmp_path / "server").start()
    admin = server.client()
    try:
        backend = lean_backend(server.url)
        assert backend.lean_connection is not None

        async def scenario() -> None:
            assert await allowed(backend, "a")
            admin.replicaof("127.0.0.1", master.port)
            with pytest.raises(BackendUnavailableError, match="READONLY"):
                await allowed(backend, "a")
            admin.replicaof("no", "one")
            assert await allowed(backend, "b")
            assert backend.lean_connection.connects == 2
            await backend.close()

        asyncio.run(scenario())
    finally:
        admin.close()
        server.kill()
        master.kill()
