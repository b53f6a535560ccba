"""Cut-over from envoyproxy/ratelimit: counters it wrote are honoured after the switch
(``sluice migrate-counters``, sluice/backends/redis/migrate.py).

The first test runs the real Go server (the binary ``bench/run.py`` also measures, built as
``/work/shared/anchors/envoyproxy-ratelimit/README.md`` says; ``SLUICE_TEST_UPSTREAM_BINARY``
names another) against a private Redis; the others write upstream's keys with upstream's
own commands (INCRBY, EXPIRE): for names the Go test does not reach, and on Redis Cluster and
Sentinel, where upstream's keys lie on other nodes than Sluice's.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import os
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from redis.crc import key_slot

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.backends.redis.connect import connect
from tests.integration.redis_support import data_nodes, scan_keys
from tests.integration.test_upstream_env import upstream_redis_env
from tests.support.processes import free_port, run_sluice, sluice_serve, stop_process, wait_until
from tests.support.redis_servers import RedisProcess

OK, OVER_LIMIT = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
UPSTREAM = Path(
    os.environ.get(
        "SLUICE_TEST_UPSTREAM_BINARY", "/work/shared/anchors/envoyproxy-ratelimit/ratelimit"
    )
)
DAY_S = 86400

CONFIG = """\
domain: rl
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
  - key: tenant
    value: acme_corp
    descriptors:
      - key: route
        rate_limit:
          unit: day
          requests_per_unit: 2
"""


def runtime(tmp_path: Path) -> dict[str, str]:
    """Upstream's runtime directory and the variables both servers read it from."""
    config = tmp_path / "runtime" / "ratelimit" / "config"
    config.mkdir(parents=True)
    (config / "config.yaml").write_text(CONFIG)
    return {
        "RUNTIME_ROOT": str(tmp_path / "runtime"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_APPDIRECTORY": "config",
        "RUNTIME_WATCH_ROOT": "false",
        "RUNTIME_IGNOREDOTFILES": "true",
        "USE_STATSD": "false",
    }


def upstream_env(tmp_path: Path, redis: RedisProcess) -> dict[str, str]:
    return {
        **runtime(tmp_path),
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": redis.url.removeprefix("redis://").split("/")[0],
        "CACHE_KEY_PREFIX": "rl_",
    }


def decide(target: str, *entries: tuple[str, str]) -> int:
    request = rls_pb2.RateLimitRequest(domain="rl")
    descriptor = request.descriptors.add()
    for key, value in entries:
        descriptor.entries.add(key=key, value=value)
    with grpc.insecure_channel(target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        return int(stub.ShouldRateLimit(request, timeout=10).overall_code)


@contextmanager
def go_ratelimit(tmp_path: Path, env: dict[str, str]) -> Iterator[str]:
    """envoyproxy/ratelimit itself, on free loopback ports; yields its gRPC target."""
    assert UPSTREAM.is_file(), f"the envoyproxy/ratelimit binary is missing: {UPSTREAM}"
    grpc_port, http_port, debug_port = free_port(), free_port(), free_port()
    ports = {
        "HOST": "127.0.0.1",
        "GRPC_HOST": "127.0.0.1",
        "DEBUG_HOST": "127.0.0.1",
        "GRPC_PORT": str(grpc_port),
        "PORT": str(http_port),
        "DEBUG_PORT": str(debug_port),
        "LOG_LEVEL": "warn",
    }
    log = open(tmp_path / "ratelimit.log", "w")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [str(UPSTREAM)], env={"PATH": "/usr/bin:/bin", **env, **ports}, stdout=log, stderr=log
    )

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthcheck", timeout=1):
                return True
        except OSError:
            return process.poll() is not None

    try:
        wait_until(healthy, 30, "envoyproxy/ratelimit")
        assert process.poll() is None, (tmp_path / "ratelimit.log").read_text()
        yield f"127.0.0.1:{grpc_port}"
    finally:
        stop_process(process, 10)
        log.close()


def not_at_a_day_boundary() -> None:
    """Both servers count in UTC day windows: a test straddling midnight would see a new
    window (a reset both of them make), so start at least a minute away from one."""
    wait_until(lambda: DAY_S - time.time() % DAY_S > 60, 90, "a minute clear of midnight UTC")


@pytest.mark.slow
def test_counts_written_by_envoyproxy_ratelimit_are_honoured_after_the_switch(
    tmp_path: Path, private_redis: RedisProcess
) -> None:
    env = upstream_env(tmp_path, private_redis)
    not_at_a_day_boundary()
    with go_ratelimit(tmp_path, env) as target:
        assert [decide(target, ("user", "alice")) for _ in range(2)] == [OK, OK]
        assert decide(target, ("tenant", "acme_corp"), ("route", "/a_b")) == OK
    window = int(time.time()) // DAY_S * DAY_S
    redis = private_redis.client()
    # The names upstream wrote: the test reads them as its documentation says.
    assert redis.get(f"rl_rl_user_alice_{window}") == b"2"
    assert redis.get(f"rl_rl_tenant_acme_corp_route_/a_b_{window}") == b"1"

    moved = run_sluice(["migrate-counters"], env={"PATH": "/usr/bin:/bin", **env}, cwd=tmp_path)
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout == "moved 2 counters (3 hits); skipped: none\n"
    again = run_sluice(["migrate-counters"], env={"PATH": "/usr/bin:/bin", **env}, cwd=tmp_path)
    assert again.stdout == "moved 0 counters (0 hits); skipped: none\n"  # nothing twice

    with sluice_serve(tmp_path, upstream_only=True, env=env) as server:
        target = server.grpc_target
        assert [decide(target, ("user", "alice")) for _ in range(2)] == [OK, OVER_LIMIT]
        assert decide(target, ("user", "bob")) == OK  # fresh counters start at 0
        nested = (("tenant", "acme_corp"), ("route", "/a_b"))
        assert [decide(target, *nested) for _ in range(2)] == [OK, OVER_LIMIT]


@pytest.mark.slow
def test_migrating_adds_to_counts_sluice_made_meanwhile_and_leaves_the_rest(
    tmp_path: Path, private_redis: RedisProcess
) -> None:
    env = upstream_env(tmp_path, private_redis)
    not_at_a_day_boundary()
    window = int(time.time()) // DAY_S * DAY_S
    redis = private_redis.client()

    def upstream_hit(name: str, n: int) -> None:  # what upstream's Redis cache does per hit
        redis.incrby(name, n)
        redis.expire(name, DAY_S)

    with sluice_serve(tmp_path, upstream_only=True, env=env) as server:
        # Sluice serves already (a rolling cut-over) while upstream still counts.
        assert decide(server.grpc_target, ("user", "carol")) == OK  # 1 of 3 on Sluice
        upstream_hit(f"rl_rl_user_carol_{window}", 1)  # 1 more on upstream
        upstream_hit(f"rl_rl_user_dave_{window - DAY_S}", 3)  # yesterday's: over already
        upstream_hit(f"rl_rl_nobody_x_{window}", 1)  # no rule counts this
        moved = run_sluice(["migrate-counters"], env={"PATH": "/usr/bin:/bin", **env}, cwd=tmp_path)
        assert moved.returncode == 0, moved.stderr
        assert moved.stdout == (
            "moved 1 counters (1 hits); skipped: 1 keys of a window already over, "
            "1 keys of no fixed-window rule\n"
        )
        assert [decide(server.grpc_target, ("user", "carol")) for _ in range(2)] == [
            OK,
            OVER_LIMIT,
        ]
        assert decide(server.grpc_target, ("user", "dave")) == OK
    assert redis.exists(f"rl_rl_nobody_x_{window}") == 1  # left where it was


async def upstream_hits(url: str, hits: list[tuple[str, int]]) -> None:
    """What upstream's Redis cache does per hit, for each (key, hits_addend)."""
    client = connect(url, timeout_s=5)
    try:
        for name, n in hits:
            await client.incrby(name, n)
            await client.expire(name, DAY_S)
    finally:
        await client.aclose()


async def existing(url: str, names: list[str]) -> list[str]:
    client = connect(url, timeout_s=5)
    try:
        return [name for name in names if await client.exists(name)]
    finally:
        await client.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["cluster", "sentinel"])
def test_counters_upstream_wrote_on_cluster_and_sentinel_are_honoured_after_the_switch(
    tmp_path: Path, topology: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(f"redis_{topology}")
    # The fixture's Redis is shared by the session: this test's keys under a prefix of its own.
    prefix = f"mc{uuid.uuid4().hex[:8]}_"
    env = {
        **runtime(tmp_path),
        **upstream_redis_env(url),
        "REDIS_SOCKET_TYPE": "tcp",
        "CACHE_KEY_PREFIX": prefix,
    }
    not_at_a_day_boundary()
    window = int(time.time()) // DAY_S * DAY_S
    # Upstream's keys have no hash tags: names alike fall in slots alike (CRC16), so the users
    # are picked two per master's slots (the Cluster fixture's: redis-cli's even split).
    per_master: list[list[str]] = [[], [], []]
    for i in itertools.count():
        slot = key_slot(f"{prefix}rl_user_u{i}_{window}".encode())
        same = per_master[bisect.bisect([5461, 10923], slot)]
        if len(same) < 2:
            same.append(f"u{i}")
        if all(len(users) == 2 for users in per_master):
            break
    users = [user for users in per_master for user in users]
    keys = [f"{prefix}rl_user_{user}_{window}" for user in users]
    nested = f"{prefix}rl_tenant_acme_corp_route_/a_b_{window}"
    asyncio.run(upstream_hits(url, [*((key, 2) for key in keys), (nested, 2)]))
    if topology == "cluster":  # on every master: a scan of one would miss some
        placed = scan_keys(data_nodes(url), f"{prefix}*")
        where = [(node.connection_pool.connection_kwargs["port"], key) for node, key in placed]
        assert len(where) == 7 and len({port for port, _ in where}) == 3, where

    moved = run_sluice(["migrate-counters"], env={"PATH": "/usr/bin:/bin", **env}, cwd=tmp_path)
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout == "moved 7 counters (14 hits); skipped: none\n"
    assert asyncio.run(existing(url, [*keys, nested])) == []  # moved, not copied

    with sluice_serve(tmp_path, upstream_only=True, env=env) as server:
        target = server.grpc_target
        # 2 of 3 a day used on upstream: one more, then refused. No limit started again.
        for user in users:
            assert [decide(target, ("user", user)) for _ in range(2)] == [OK, OVER_LIMIT]
        assert decide(target, ("user", "fresh")) == OK
        # 2 of 2 used on upstream: refused at once.
        assert decide(target, ("tenant", "acme_corp"), ("route", "/a_b")) == OVER_LIMIT
