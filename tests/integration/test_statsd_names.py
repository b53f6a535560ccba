"""Sluice's statsd counters against envoyproxy/ratelimit's own, for one config and one
sequence of requests: the real Go binary (as tests/integration/test_migrate_counters.py runs
it) and ``sluice serve`` each send statsd to a UDP listener of the test, and the
``ratelimit.service.rate_limit.*`` counters they send must be the same names with the same
values (detailed_metric, value_to_metric, share_threshold, wildcards, client limits,
unlimited rules, hits over the limit, hits that cross it, in shadow mode too)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tests.integration.test_migrate_counters import go_ratelimit
from tests.integration.test_statsd import StatsdListener
from tests.support.processes import sluice_serve, wait_until
from tests.support.redis_servers import RedisProcess
from tests.unit.test_statsd import NAMES_CONFIG, NAMES_OVERRIDE, NAMES_REQUESTS, UPSTREAM_NAMES

PREFIX = "ratelimit.service.rate_limit."
Entries = tuple[tuple[str, str], ...]
# (entries, hits_addend, the client's own requests_per_unit a minute or 0): each rule once,
# then some past their limit of 2 a minute.
CALLS: list[tuple[Entries, int, int]] = [
    *((entries, 0, 0) for entries in NAMES_REQUESTS),
    (NAMES_OVERRIDE, 0, 5),
    *((((key, value),), 0, 0) for key, value in [("det", "d1")] * 2 + [("wild", "abc")] * 3),
    ((("v2m", "v1"),), 0, 0),
    # share_s* counts every value it matches on one counter: past its 2 at the third.
    *(((("share", "s2"),), 0, 0) for _ in range(2)),
    # Near the limit of 10 past floor(10 × 0.8) = 8 only: 1 + 6 = 7 is not near, 7 + 2 = 9
    # is one hit near, the next one too; then 10 + 1 is over.
    ((("ten", "t"),), 6, 0),
    ((("ten", "t"),), 2, 0),
    ((("ten", "t"),), 1, 0),
    ((("ten", "t"),), 1, 0),
    # Hits that cross the limit of 10: only their part past it is over_limit, their part
    # past 8 near_limit, the rest in total_hits alone. 5, then 7 (5 + 7 = 12): 2 over,
    # 2 near; the same 7 again: refused by the local cache, all 7 over.
    ((("ten", "x"),), 5, 0),
    ((("ten", "x"),), 7, 0),
    ((("ten", "x"),), 7, 0),
    # 9 (1 near), then 3 (9 + 3 = 12): 2 over, 1 near.
    ((("ten", "y"),), 9, 0),
    ((("ten", "y"),), 3, 0),
    # 15 at once, which can never fit: 5 over, 2 near.
    ((("ten", "z"),), 15, 0),
    # In shadow mode: 2 over_limit and shadow_mode, 2 near.
    ((("tenshadow", "a"),), 5, 0),
    ((("tenshadow", "a"),), 7, 0),
]


# Requests to a domain no config has, with this many descriptors each (upstream counts
# <domain>.domain_not_found per descriptor looked up).
UNKNOWN_DOMAIN_CALLS = [("nowhere", 2), ("nowhere", 1), ("else.where", 1)]


def send(target: str, calls: list[tuple[Entries, int, int]]) -> None:
    with grpc.insecure_channel(target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for entries, hits_addend, override in calls:
            request = rls_pb2.RateLimitRequest(domain="d", hits_addend=hits_addend)
            descriptor = request.descriptors.add()
            for key, value in entries:
                descriptor.entries.add(key=key, value=value)
            if override:
                descriptor.limit.requests_per_unit = override
                descriptor.limit.unit = rls_pb2.RateLimitResponse.RateLimit.MINUTE
            stub.ShouldRateLimit(request, timeout=10)
        for domain, descriptors in UNKNOWN_DOMAIN_CALLS:
            request = rls_pb2.RateLimitRequest(domain=domain)
            for i in range(descriptors):
                request.descriptors.add().entries.add(key="k", value=str(i))
            stub.ShouldRateLimit(request, timeout=10)


def pool_metrics(listener: StatsdListener) -> set[tuple[str, str]]:
    """The names and types (c, g) of the ``ratelimit.redis_pool.*`` metrics received."""
    return {
        (name, rest.partition("|")[2][:1])
        for name, _, rest in (line.partition(":") for line in listener.receive())
        if name.startswith("ratelimit.redis_pool.")
    }


def rate_limit_counters(listener: StatsdListener) -> Counter[str]:
    return Counter(
        {k.removeprefix(PREFIX): v for k, v in listener.counters().items() if k.startswith(PREFIX)}
    )


def hits(counters: Counter[str]) -> int:
    return sum(n for name, n in counters.items() if name.endswith(".total_hits"))


def arrived(listener: StatsdListener) -> bool:
    """Every counted hit and every descriptor of an unknown domain."""
    counters = rate_limit_counters(listener)
    unknown = sum(n for name, n in counters.items() if name.endswith(".domain_not_found"))
    return hits(counters) >= COUNTED_HITS and unknown >= UNKNOWN_DESCRIPTORS


def collect(run: Callable[[StatsdListener], None]) -> tuple[Counter[str], set[tuple[str, str]]]:
    """What one server sent for CALLS, waited for until every counted hit has arrived: the
    rate-limit counters, and the Redis pool's metrics' names and types."""
    # The limits count per minute: CALLS must not straddle the start of one (a reset).
    wait_until(lambda: 60 - time.time() % 60 > 10, 15, "ten seconds clear of a minute's end")
    listener = StatsdListener()
    run(listener)
    return rate_limit_counters(listener), pool_metrics(listener)


def statsd_env(listener: StatsdListener) -> dict[str, str]:
    return {
        "USE_STATSD": "true",
        # gostats' default is TCP; both read this variable (UDP: the test reads datagrams).
        "STATSD_PROTOCOL": "udp",
        "STATSD_HOST": "127.0.0.1",
        "STATSD_PORT": str(listener.port),
        "STATS_FLUSH_INTERVAL": "200ms",
    }


def runtime(tmp_path: Path, redis: RedisProcess) -> dict[str, str]:
    config = tmp_path / "runtime" / "ratelimit" / "config"
    config.mkdir(parents=True)
    (config / "config.yaml").write_text(NAMES_CONFIG)
    return {
        "RUNTIME_ROOT": str(tmp_path / "runtime"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_APPDIRECTORY": "config",
        "RUNTIME_WATCH_ROOT": "false",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": redis.url.removeprefix("redis://").split("/")[0],
        # Both with a local over-limit cache (upstream's is off by default, Sluice's on), so
        # over_limit_with_local_cache is compared too.
        "LOCAL_CACHE_SIZE_IN_BYTES": "1048576",
    }


# Every call but the two on unlimited rules is counted, for its hits_addend (0 means 1).
COUNTED_HITS = sum(
    max(1, addend) for entries, addend, _ in CALLS if entries[0][0] not in ("unl", "unldet")
)
UNKNOWN_DESCRIPTORS = sum(n for _, n in UNKNOWN_DOMAIN_CALLS)


@pytest.mark.slow
def test_statsd_counters_are_those_envoyproxy_ratelimit_sends(
    tmp_path: Path, private_redis: RedisProcess
) -> None:
    env = runtime(tmp_path, private_redis)

    def upstream(listener: StatsdListener) -> None:
        with go_ratelimit(tmp_path, {**env, **statsd_env(listener)}) as target:
            send(target, CALLS)
            wait_until(
                lambda: arrived(listener),
                timeout_s=10,
                what="envoyproxy/ratelimit's counters",
            )

    def sluice(listener: StatsdListener) -> None:
        with sluice_serve(
            tmp_path, upstream_only=True, env={**env, **statsd_env(listener)}
        ) as server:
            send(server.grpc_target, CALLS)
            wait_until(
                lambda: arrived(listener),
                timeout_s=10,
                what="Sluice's counters",
            )

    theirs, their_pool = collect(upstream)
    assert {name.rsplit(".", 1)[0] for name in theirs} == UPSTREAM_NAMES | {
        "d.tenshadow",
        "nowhere",
        "else.where",
    }
    assert theirs["nowhere.domain_not_found"] == 3
    # t: 1 + 6 + 2 + 1 + 1 = 11, the last one over; x: 5 + 7 = 12 of 10, 2 over, then 7 more
    # (the local cache), 7 over; y: 9 + 3, 2 over; z: 15, 5 over. Never a crossing hit whole.
    assert theirs["d.ten.over_limit"] == 1 + 2 + 7 + 2 + 5
    assert theirs["d.tenshadow.shadow_mode"] == 2
    ours, our_pool = collect(sluice)
    assert ours == theirs
    # The pool's figures differ (upstream opens REDIS_POOL_SIZE connections, Sluice one, which
    # carries every call), not their names and types (cx_local_close: none was closed).
    pool = "ratelimit.redis_pool."
    assert their_pool == {(pool + "cx_active", "g"), (pool + "cx_total", "c")}
    assert our_pool == their_pool
