"""Redis URLs: Sentinel and Cluster host lists, credentials, and clients built from them."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster

from sluice.backends.redis.connect import (
    RedisTls,
    RedisUrl,
    SharedSslContext,
    connect,
    parse_url,
)
from tests.support.certs import make_pki


def test_sentinel_urls() -> None:
    assert parse_url("redis+sentinel://u:p%40ss@h1,h2:26380,[::1]:7/main/2") == RedisUrl(
        "redis+sentinel",
        (("h1", 26379), ("h2", 26380), ("::1", 7)),
        "u",
        "p@ss",
        ("main", "2"),
    )


def test_cluster_urls() -> None:
    parsed = parse_url("rediss+cluster://:secret@a:7000,b")
    assert parsed.hosts == (("a", 7000), ("b", 6379))
    assert (parsed.username, parsed.password, parsed.tls) == (None, "secret", True)


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://h:1",  # no service
        "redis+sentinel://h:1/svc/x",  # bad DB
        "redis+cluster://h:1/3",  # cluster has no DB
        "redis+cluster://h:port",
        "memcached://h:1",
    ],
)
def test_bad_urls_are_refused_without_echoing_secrets(url: str) -> None:
    with pytest.raises(ValueError) as info:
        connect(url.replace("://", "://u:hunter2@"))
    assert "hunter2" not in str(info.value)


def test_clients_have_bounded_blocking_pools_and_short_timeouts() -> None:
    client = connect("redis://:pw@127.0.0.1:1/3", pool_size=7, timeout_s=0.05)
    assert isinstance(client, Redis)
    pool = client.connection_pool
    assert isinstance(pool, BlockingConnectionPool)
    assert (pool.max_connections, pool.timeout) == (7, 0.05)
    kwargs = pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.05, 0.05)
    assert kwargs["retry"].get_retries() == 0
    sentinel = connect("redis+sentinel://127.0.0.1:1/main", pool_size=3)
    assert isinstance(sentinel.connection_pool, BlockingConnectionPool)
    assert sentinel.connection_pool.max_connections == 3
    assert isinstance(connect("redis+cluster://127.0.0.1:1"), RedisCluster)


@pytest.mark.parametrize(
    "url", ["rediss://127.0.0.1:1/0", "rediss+sentinel://127.0.0.1:1/mymaster"]
)
def test_tls_connections_share_one_context_to_reload(tmp_path: Path, url: str) -> None:
    # sluice.tls_reload loads a rotated client certificate into SharedSslContext.context:
    # every connection the pool opens must use that one, not a context of its own.
    pki = make_pki(tmp_path)
    shared = SharedSslContext()
    tls = RedisTls(str(pki.ca), str(pki.client_cert), str(pki.client_key))
    client = connect(url, tls=tls, shared_ssl_context=shared)
    first, second = (client.connection_pool.make_connection() for _ in range(2))
    assert shared.context is not None
    assert first.ssl_context.get() is shared.context
    assert second.ssl_context.get() is shared.context
    # Without one, each connection builds its own from the files, as redis-py does.
    own = connect(url, tls=tls).connection_pool.make_connection()
    assert own.ssl_context.get() is not shared.context
