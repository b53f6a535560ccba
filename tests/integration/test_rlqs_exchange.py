"""Two instances sharing one limit through Redis (standalone and Cluster): each holds one
stream on the same bucket, and their assignments add up to the rule's rate."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from sluice.backends.redis.connect import connect
from sluice.clock import ManualClock
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.rlqs.exchange import RedisExchange
from sluice.rlqs.service import QuotaService
from tests.support.rlqs_streams import Collector, Feed, run

POLICY = """
domain: shared
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 200}
"""
BUCKET = {"tenant": "acme"}


@pytest.fixture(params=["standalone", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    return str(
        request.getfixturevalue(
            "redis_server" if request.param == "standalone" else "redis_cluster"
        )
    )


@pytest.fixture
def prefix() -> Iterator[str]:
    yield f"rlqs-test-{uuid.uuid4().hex[:8]}:"


def instance(url: str, prefix: str, clock: ManualClock) -> QuotaService:
    snapshot = Snapshot(load_text(POLICY, "policy.yaml"))
    exchange = RedisExchange(connect(url, timeout_s=2), key_prefix=prefix)
    return QuotaService(lambda: snapshot, clock, exchange=exchange)


@run
async def test_instances_split_one_limit_by_demand(redis_url: str, prefix: str) -> None:
    clock = ManualClock(1000.0)
    one, two = instance(redis_url, prefix, clock), instance(redis_url, prefix, clock)
    busy, quiet = Feed(), Feed()
    busy_out, quiet_out = Collector(one.stream(busy)), Collector(two.stream(quiet))
    try:
        busy.report((BUCKET, 0, 0, 0), domain="shared")
        await busy_out.wait(1)
        assert busy_out.rate == 200  # alone so far: the whole limit
        quiet.report((BUCKET, 0, 0, 0), domain="shared")
        await quiet_out.wait(1)
        assert quiet_out.rate == 0  # instance one holds it all, for now
        busy.report((BUCKET, 5, 1000, 1500))  # 500 a second asked
        quiet.report((BUCKET, 5, 100, 0))  # 20 a second asked
        await busy_out.wait(2)
        await quiet_out.wait(2)
        # At every step the grants add up to at most the limit; within two rebalances
        # they follow demand.
        for _ in range(3):
            for service in (one, two):
                await service.rebalance()
                await busy_out.settle()
                await quiet_out.settle()
                assert busy_out.rate + quiet_out.rate <= 1.02 * 200
        assert busy_out.rate > 5 * quiet_out.rate > 0
        assert busy_out.rate + quiet_out.rate >= 0.95 * 200
    finally:
        await one.stop()
        await two.stop()
        await busy_out.close()
        await quiet_out.close()


@run
async def test_grants_never_add_up_to_more_than_the_limit(redis_url: str, prefix: str) -> None:
    first = RedisExchange(connect(redis_url, timeout_s=2), key_prefix=prefix, ttl_s=0.3)
    second = RedisExchange(connect(redis_url, timeout_s=2), key_prefix=prefix, ttl_s=0.3)
    key = ("shared", "tenant", "acme")
    try:
        assert await first.exchange({key: 30.0}) == {key: 1.0}  # alone: all of it
        # The second is owed a quarter, but the first holds everything until it gives back.
        assert await second.exchange({key: 10.0}) == {key: 0.0}
        assert await first.exchange({key: 30.0}) == {key: 0.75}
        assert await second.exchange({key: 10.0}) == {key: 0.25}
        # The first stops: Redis's own clock ages its part out, and the second takes it.
        for _ in range(100):
            alone = await second.exchange({key: 10.0})
            if alone[key] == 1.0:
                break
            await asyncio.sleep(0.05)
        assert alone == {key: 1.0}
    finally:
        await first.close()
        await second.close()


@run
async def test_an_unreachable_redis_keeps_the_last_grants(prefix: str) -> None:
    exchange = RedisExchange(connect("redis://127.0.0.1:1", timeout_s=0.2), key_prefix=prefix)
    key = ("shared", "tenant", "acme")
    try:
        assert await exchange.exchange({key: 5.0}) == {key: 1.0}  # none known: all of it
        assert exchange.failures == 1
    finally:
        await exchange.close()
