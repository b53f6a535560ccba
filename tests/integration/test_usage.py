"""Usage telemetry against real databases and real servers: figures add up across instances,
survive a store outage, and show in /metrics."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from sqlalchemy.engine import make_url

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.clock import ManualClock
from sluice.policies.store import PolicyStore
from sluice.usage.flusher import UsageFlusher
from sluice.usage.recorder import ALLOWED, BLOCKED, OVER_LIMIT, UsageRecorder
from sluice.usage.store import MINUTE, UsageStore
from tests.support.processes import SluiceProcess, run_sluice, sluice_serve, wait_until
from tests.support.tcp_proxy import TcpProxy

POLICY = """domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'config.db'}"
    return request.getfixturevalue("postgres_url")


def test_flushes_add_up_and_the_series_reads_them_back(database_url: str) -> None:
    with PolicyStore(database_url) as store:
        store.upgrade()
        usage = UsageStore(store.database)
        clock = ManualClock(1_000_020.4)
        recorders = [UsageRecorder(), UsageRecorder()]  # two servers, one store
        flushers = [UsageFlusher(r, usage, clock) for r in recorders]
        for recorder in recorders:
            recorder.record("shop.user", ALLOWED, cost=2)
            recorder.record("shop.user", OVER_LIMIT, offender="user,mallory")
        for flusher in flushers:
            assert asyncio.run(flusher.flush_once())
        clock.advance(1)
        recorders[0].record("shop.user", OVER_LIMIT, offender="user,mallory")
        recorders[0].record("shop.user", OVER_LIMIT, offender="user,eve")
        asyncio.run(flushers[0].flush_once())

        seconds = usage.series("shop.", since_s=1_000_000)["shop.user"]
        assert [(p.bucket_s, p.allowed, p.over_limit) for p in seconds] == [
            (1_000_020, 4, 2),
            (1_000_021, 0, 2),
        ]
        [minute] = usage.series("shop.", since_s=0, resolution_s=MINUTE)["shop.user"]
        assert (minute.bucket_s, minute.allowed, minute.over_limit) == (999_960 + 60, 4, 4)
        assert usage.top_offenders("shop.user", since_s=0) == [("user,mallory", 3), ("user,eve", 1)]

        usage.expire(1_000_021 + 3601)  # the per-second rows age out first
        assert usage.series("shop.", since_s=0) == {}
        assert usage.series("shop.", since_s=0, resolution_s=MINUTE) != {}


def test_per_key_figures_add_up_per_second_and_keep_each_minutes_peak(database_url: str) -> None:
    with PolicyStore(database_url) as store:
        store.upgrade()
        usage = UsageStore(store.database)
        clock = ManualClock(1_000_020.4)
        recorders = [UsageRecorder(), UsageRecorder()]  # two servers, one store
        flushers = [UsageFlusher(r, usage, clock, top_keys_per_second=1) for r in recorders]

        def hits(recorder: UsageRecorder, user: str, n: int) -> None:
            recorder.record("shop.user", ALLOWED, cost=n, key=("shop", "user", user))

        hits(recorders[0], "alice", 5)
        hits(recorders[0], "bob", 2)
        hits(recorders[0], "carol", 1)
        hits(recorders[1], "alice", 4)
        for flusher in flushers:
            assert asyncio.run(flusher.flush_once())
        clock.advance(1)
        hits(recorders[0], "alice", 3)
        hits(recorders[0], "dave", 2)
        assert asyncio.run(flushers[0].flush_once())

        seconds = usage.key_record("shop.user", since_s=0)
        assert seconds.keys == [(1_000_020, "user,alice", 9), (1_000_021, "user,alice", 3)]
        # (second, bin floor, keys, hits) of the keys not kept by name
        assert seconds.bins == [(1_000_020, 1, 1, 1), (1_000_020, 2, 1, 2), (1_000_021, 2, 1, 2)]
        minutes = usage.key_record("shop.user", since_s=0, resolution_s=MINUTE)
        assert minutes.keys == [(1_000_020, "user,alice", 9)]  # its busiest second
        assert minutes.bins == [(1_000_020, 1, 1, 1), (1_000_020, 2, 1, 2)]

        usage.expire(1_000_021 + 3601)  # seconds age out after an hour, minutes after two days
        assert usage.key_record("shop.user", since_s=0).keys == []
        assert usage.key_record("shop.user", since_s=0, resolution_s=MINUTE).keys != []


def test_blocked_hits_are_a_column_of_their_own_also_after_an_upgrade(
    database_url: str,
) -> None:
    with PolicyStore(database_url) as store:
        store.upgrade("0004")  # a database from before blocks, then upgraded
        store.upgrade()
        usage = UsageStore(store.database)
        recorder = UsageRecorder()
        flusher = UsageFlusher(recorder, usage, ManualClock(1_000_020.0))
        recorder.record("shop.user", BLOCKED, cost=3)
        recorder.record("shop.user", ALLOWED)
        assert asyncio.run(flusher.flush_once())
        [point] = usage.series("shop.", since_s=0)["shop.user"]
        assert (point.allowed, point.over_limit, point.blocked) == (1, 0, 3)


def test_a_store_outage_loses_nothing(postgres_url: str) -> None:
    real = make_url(postgres_url)
    proxy = TcpProxy(real.host or "127.0.0.1", real.port or 5432)
    through = real.set(port=proxy.port, query={"connect_timeout": "2"})
    try:
        with PolicyStore(through.render_as_string(hide_password=False)) as store:
            store.upgrade()
            recorder = UsageRecorder()
            flusher = UsageFlusher(recorder, UsageStore(store.database), ManualClock(5_000_000))
            recorder.record("shop.user", ALLOWED, cost=3)
            assert asyncio.run(flusher.flush_once())
            proxy.cut()
            for _ in range(3):
                recorder.record("shop.user", ALLOWED, cost=5)
                assert not asyncio.run(flusher.flush_once())
            assert flusher.failures == 3 and not flusher.store_up
            proxy.restore()
            assert asyncio.run(flusher.flush_once())
        with PolicyStore(postgres_url) as direct:
            [point] = UsageStore(direct.database).series("shop.", since_s=0)["shop.user"]
            assert point.allowed == 3 + 15
    finally:
        proxy.close()


def test_stopping_during_a_flush_sends_each_figure_once(tmp_path: Path) -> None:
    """A flush still waiting on the store when the server stops must not be sent again by
    the final flush (nor have figures added to it while its thread reads them)."""
    path = tmp_path / "config.db"
    with PolicyStore(f"sqlite:///{path}") as store:
        store.upgrade()
        blocker = sqlite3.connect(path, isolation_level=None)
        try:

            async def scenario() -> None:
                drained = asyncio.Event()
                recorder = UsageRecorder()
                flusher = UsageFlusher(
                    recorder,
                    UsageStore(store.database),
                    ManualClock(7_000_000),
                    interval_s=0.01,
                    on_drain=lambda _: drained.set(),
                )
                blocker.execute("BEGIN IMMEDIATE")  # the store's writes wait for this lock
                recorder.record("shop.user", ALLOWED, cost=2)
                flusher.start()
                await asyncio.wait_for(drained.wait(), 10)  # a flush took the 2 and waits
                recorder.record("shop.user", ALLOWED, cost=3)
                stopping = asyncio.ensure_future(flusher.stop())
                for _ in range(100):  # event-loop turns, not time: stop() cancels the flush
                    await asyncio.sleep(0)
                blocker.execute("ROLLBACK")
                await asyncio.wait_for(stopping, 30)

            asyncio.run(scenario())
        finally:
            blocker.close()
        [point] = UsageStore(store.database).series("shop.", since_s=0)["shop.user"]
        assert point.allowed == 2 + 3


def test_a_store_that_hangs_is_reported_and_its_send_waited_for_not_repeated(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.db"
    with PolicyStore(f"sqlite:///{path}") as store:
        store.upgrade()
        blocker = sqlite3.connect(path, isolation_level=None)
        try:

            async def scenario() -> None:
                recorder = UsageRecorder()
                flusher = UsageFlusher(
                    recorder, UsageStore(store.database), ManualClock(8_000_000), timeout_s=0.2
                )
                blocker.execute("BEGIN IMMEDIATE")  # writes wait: the store hangs
                recorder.record("shop.user", ALLOWED, cost=2)
                assert not await flusher.flush_once()
                assert (flusher.store_up, flusher.failures) == (False, 1)
                recorder.record("shop.user", ALLOWED, cost=3)
                assert not await flusher.flush_once()  # still the first send, not a second
                assert flusher.failures == 2
                blocker.execute("ROLLBACK")
                async with asyncio.timeout(30):
                    while not await flusher.flush_once():
                        pass
                assert flusher.store_up

                blocker.execute("BEGIN IMMEDIATE")
                recorder.record("shop.user", ALLOWED, cost=7)
                started = time.monotonic()
                await flusher.stop()  # bounded by the timeout, whatever the store does
                assert time.monotonic() - started < 2
                assert allowed(store) == 2 + 3  # each once; the 7 still waits for the lock
                blocker.execute("ROLLBACK")  # the send given up on lands when the store answers
                async with asyncio.timeout(30):
                    while allowed(store) != 2 + 3 + 7:
                        await asyncio.sleep(0.01)

            asyncio.run(scenario())
        finally:
            blocker.close()


def allowed(store: PolicyStore) -> int:
    [point] = UsageStore(store.database).series("shop.", since_s=0)["shop.user"]
    return point.allowed


def ask(server: SluiceProcess, user: str) -> None:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=user)
    request = rls_pb2.RateLimitRequest(
        domain="shop", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )
    with grpc.insecure_channel(server.grpc_target) as channel:
        rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=5)


@pytest.fixture
def two_servers(database_url: str, tmp_path: Path) -> Iterator[list[SluiceProcess]]:
    (tmp_path / "p.yaml").write_text(POLICY)
    assert (
        run_sluice(["import", str(tmp_path / "p.yaml"), "--database-url", database_url]).returncode
        == 0
    )
    with ExitStack() as stack:
        servers = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            servers.append(
                stack.enter_context(
                    sluice_serve(
                        tmp_path / name,
                        database_url=database_url,
                        extra_args=["--usage-flush-interval-s", "0.2"],
                    )
                )
            )
        yield servers


@pytest.mark.slow
def test_two_servers_add_up_exactly_in_the_store(
    two_servers: list[SluiceProcess], database_url: str
) -> None:
    a, b = two_servers
    for n in range(5):
        ask(a, "alice")  # 3 allowed, 2 over on a's own memory counters
        ask(b, f"bob-{n}")  # 5 allowed
    with PolicyStore(database_url) as store:
        usage = UsageStore(store.database)

        def totals() -> tuple[int, int]:
            points = usage.series("shop.", since_s=0, resolution_s=MINUTE).get("shop.user", [])
            return sum(p.allowed for p in points), sum(p.over_limit for p in points)

        wait_until(lambda: totals() == (8, 2), 10, "both servers' figures in the store")
        assert usage.top_offenders("shop.user", since_s=0) == [("user,alice", 2)]

    with urllib.request.urlopen(a.http_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    assert 'sluice_rule_hits_total{domain="shop",result="allowed",rule="shop.user"} 3.0' in text
    assert 'sluice_rule_hits_total{domain="shop",result="over_limit",rule="shop.user"} 2.0' in text
    # Results are exclusive (a sum over them counts each hit once); total_hits is that sum.
    assert 'sluice_rule_total_hits_total{domain="shop",rule="shop.user"} 5.0' in text
    assert 'sluice_rule_near_limit_total{domain="shop",rule="shop.user"} 1.0' in text
    assert 'result="near_limit"' not in text
    assert "_created" not in text
    assert "sluice_request_duration_seconds_bucket" in text
    assert "sluice_config_database_up 1.0" in text
    assert "process_resident_memory_bytes" in text
