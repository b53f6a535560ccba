"""The Redis backend against real standalone, Sentinel and Cluster deployments: the same
decisions as the memory backend, one script call per request, concurrent requests sharing
calls, and state that always expires."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Iterator

import pytest

from sluice.algorithms import ALGORITHMS, Limit
from sluice.algorithms.calendar import calendar_for
from sluice.backends import Hit
from sluice.backends.memory import MemoryBackend
from sluice.backends.redis.backend import RedisBackend
from sluice.backends.redis.connect import connect
from sluice.model import Unit
from tests.integration.redis_support import (
    calls,
    data_nodes,
    evalsha_calls,
    reset_stats,
    scan_keys,
)

SCRIPT_LOADING = ("eval", "script|load", "script|exists")


@pytest.fixture(params=["standalone", "sentinel", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    fixture = {"standalone": "redis_server", "sentinel": "redis_sentinel"}
    return request.getfixturevalue(fixture.get(request.param, "redis_cluster"))


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}:"


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def backend(url: str, prefix: str, **kwargs: object) -> RedisBackend:
    return RedisBackend(connect(url, timeout_s=2), key_prefix=prefix, **kwargs)  # type: ignore[arg-type]


def test_decisions_match_the_memory_backend(
    url: str, prefix: str, loop: asyncio.AbstractEventLoop
) -> None:
    rng = random.Random(7)
    rules = [
        (Limit(3, 60, ALGORITHMS["fixed_window"]), Limit(5, 3600, ALGORITHMS["gcra"], 2)),
        (Limit(4, 10, ALGORITHMS["sliding_window_log"]),),
        (
            Limit(4, 10, ALGORITHMS["sliding_window_counter"]),
            Limit(6, 60, ALGORITHMS["token_bucket"], 6),
        ),
        (Limit(2, 5, ALGORITHMS["leaky_bucket"], 3),),
    ]
    requests = []
    now = 1_700_000_000.25
    for _ in range(60):
        now += rng.choice([0.0, 0.1, 0.7, 2.5])
        hits = [
            Hit(("d", "k", str(rng.randrange(2))), rules[r], rng.randrange(3))
            for r in rng.sample(range(len(rules)), rng.randint(1, 3))
        ]
        requests.append((now, hits))
    memory = MemoryBackend()
    # The caller's clock, so both backends see the same times.
    redis_backend = backend(url, prefix, server_time=False)

    async def run() -> None:
        for now, hits in requests:
            assert await redis_backend.apply(hits, now) == memory.apply_now(hits, now)
        await redis_backend.close()

    loop.run_until_complete(run())


def test_one_script_call_per_request(
    url: str, prefix: str, loop: asyncio.AbstractEventLoop
) -> None:
    nodes = data_nodes(url)
    limits = (
        Limit(100, 60, ALGORITHMS["fixed_window"]),
        Limit(1000, 3600, ALGORITHMS["gcra"], 50),
        Limit(10, 1, ALGORITHMS["token_bucket"], 10),
    )
    # Three descriptors of one request; on Cluster they must share a slot to share a call.
    hits = [Hit(("d", "user", "u1"), limits, 1)] * 3
    b = backend(url, prefix)

    async def run() -> None:
        await b.apply(hits, 0)  # the first call may have to load the script
        reset_stats(nodes)
        for _ in range(20):
            await b.apply(hits, 0)
        await b.close()

    loop.run_until_complete(run())
    assert evalsha_calls(nodes) == 20
    assert calls(nodes, *SCRIPT_LOADING) == 0


def test_concurrent_requests_share_script_calls(
    url: str, prefix: str, loop: asyncio.AbstractEventLoop
) -> None:
    nodes = data_nodes(url)
    limit = (Limit(50, 3600, ALGORITHMS["fixed_window"]),)
    b = backend(url, prefix)

    async def run() -> list[bool]:
        await b.apply([Hit(("warm",), limit, 0)], 0)
        reset_stats(nodes)
        results = await asyncio.gather(
            *(b.apply([Hit(("d", "hot"), limit, 1)], 0) for _ in range(100))
        )
        await b.close()
        return [outcomes[0][0].allowed for outcomes in results]

    admitted = loop.run_until_complete(run())
    assert admitted.count(True) == 50
    script_calls = evalsha_calls(nodes)
    assert script_calls <= 5, f"100 concurrent requests took {script_calls} script calls"
    print(f"\n{url.partition(':')[0]}: 100 concurrent requests, {script_calls} script call(s)")


def test_every_key_has_a_ttl_and_the_prefix(
    url: str, prefix: str, loop: asyncio.AbstractEventLoop
) -> None:
    nodes = data_nodes(url)
    values = ["plain", "with:colon", "{brace}", "ünï", "x" * 300]
    limits = tuple(
        Limit(5, period, ALGORITHMS[algorithm], 5) for algorithm in ALGORITHMS for period in (7,)
    )
    b = backend(url, prefix)

    async def run() -> None:
        for value in values:
            await b.apply([Hit(("d", "k", value), limits, 1)], 0)
        await b.close()

    loop.run_until_complete(run())
    found = scan_keys(nodes, "*")
    mine = [(node, key) for node, key in found if key.startswith(prefix.encode())]
    assert len(mine) == len(values) * len(ALGORITHMS)
    for node, key in mine:
        # At most two periods (a sliding window counter needs the previous window) + slack.
        assert 0 < node.pttl(key) <= 2 * 7_000 + 1_000, key
        assert len(key) < 200, key  # the long value was hashed
    tags = {key.split(b"}")[0] for _, key in mine}
    assert len(tags) == len(values)  # one hash tag per counter, none shared


def test_the_key_prefix_is_honoured(url: str, loop: asyncio.AbstractEventLoop) -> None:
    nodes = data_nodes(url)
    prefix = f"custom-{uuid.uuid4().hex[:6]}/"
    b = backend(url, prefix)
    loop.run_until_complete(
        b.apply([Hit(("d", "k"), (Limit(1, 60, ALGORITHMS["fixed_window"]),), 1)], 0)
    )
    loop.run_until_complete(b.close())
    keys = [key for _, key in scan_keys(nodes, prefix + "*")]
    assert keys == [f"{prefix}{{d:k}}:fixed_window:60".encode()]


def test_calendar_windows_on_redis_clock_count_to_the_next_boundary(
    url: str, prefix: str, loop: asyncio.AbstractEventLoop
) -> None:
    # Redis decides on its own clock (server_time, the default); Sluice lays the calendar's
    # windows out from the request's time, which here is this machine's clock too.
    month = Unit.MONTH
    limits = (
        Limit(
            2, month.seconds, ALGORITHMS["fixed_window"], calendar=calendar_for(month, "Asia/Tokyo")
        ),
        Limit(
            2,
            month.seconds,
            ALGORITHMS["sliding_window_counter"],
            calendar=calendar_for(month, "Asia/Tokyo"),
        ),
    )
    b = backend(url, prefix)

    async def run() -> list[tuple]:
        outcomes = []
        for _ in range(3):
            now = time.time()
            outcomes.append((now, await b.apply([Hit(("d", "tenant", "t1"), limits, 1)], now)))
        await b.close()
        return outcomes

    (first_at, (first,)), _, (third_at, (third,)) = loop.run_until_complete(run())
    boundary = limits[0].calendar.boundaries(first_at)[4]
    fixed, sliding = first
    assert fixed.allowed and sliding.allowed
    # Counted to the end of Tokyo's month (Redis's clock and this one read apart: a second).
    assert abs(first_at + fixed.reset_s - boundary) < 1.0
    assert [o.allowed for o in third] == [False, False]
    assert abs(third_at + third[0].reset_s - boundary) < 1.0
