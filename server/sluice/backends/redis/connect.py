"""A ``redis.asyncio`` client from a URL, with a bounded pool and short timeouts.

Accepted URLs:

* ``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`` and ``rediss://…`` (TLS); redis-py's query
  options (e.g. ``?ssl_cert_reqs=none``) apply.
* ``redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/SERVICE[/DB]`` (and
  ``rediss+sentinel://`` for TLS): the hosts are Sentinels (default port 26379) that name
  the master of SERVICE. The credentials authenticate to the master; Sentinels are asked
  without credentials.
* ``redis+cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]`` (and
  ``rediss+cluster://``): any reachable nodes of a Redis Cluster (default port 6379); the
  rest of the cluster is discovered.

Timeouts are short and redis-py's retries are off: a script call is not idempotent (a
retry after a lost reply would count a hit twice), and the caller's failure mode, not a
retry loop, decides what a dead Redis costs. The pool blocks (up to the timeout) instead of
failing when every connection is busy.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import RedisSSLContext, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedSSLConnection,
)
from redis.backoff import NoBackoff

__all__ = ["RedisTls", "RedisUrl", "SharedSslContext", "connect", "parse_url"]

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
PLAIN_SCHEMES = ("redis", "rediss")


@dataclass(frozen=True)
class RedisUrl:
    """A multi-host URL, parsed (``urllib`` cannot: it expects one host)."""

    scheme: str
    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    path: tuple[str, ...]  # non-empty segments

    @property
    def tls(self) -> bool:
        return self.scheme.startswith("rediss")


def parse_url(url: str) -> RedisUrl:
    """Parse a Sentinel or Cluster URL; errors never echo the URL (it may hold a password)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SENTINEL_SCHEMES + CLUSTER_SCHEMES:
        raise ValueError(f"not a redis+sentinel:// or redis+cluster:// URL (scheme {scheme!r})")
    netloc, _, path = rest.partition("/")
    path = path.partition("?")[0]
    credentials, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    default_port = 26379 if scheme in SENTINEL_SCHEMES else 6379
    hosts = tuple(_host_port(item, default_port) for item in hostlist.split(",") if item)
    if not hosts:
        raise ValueError(f"{scheme}:// URL names no host")
    return RedisUrl(scheme, hosts, username, password, tuple(p for p in path.split("/") if p))


def _host_port(item: str, default_port: int) -> tuple[str, int]:
    if item.startswith("["):  # [IPv6]:port
        host, _, tail = item[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
    try:
        return host, int(port) if port else default_port
    except ValueError:
        raise ValueError(f"bad port {port!r} in a Redis URL") from None


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """Sentinel's master discovery over a pool that waits for a free connection."""


@dataclass(frozen=True)
class RedisTls:
    """PEM files for a TLS connection (``rediss``); empty names mean redis-py's defaults
    (the system's CA bundle, no client certificate)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.ca_file:
            options["ssl_ca_certs"] = self.ca_file
        if self.cert_file:
            options.update(ssl_certfile=self.cert_file, ssl_keyfile=self.key_file)
        return options


class SharedSslContext:
    """One ``ssl.SSLContext`` for every TLS connection of a client, so that a new client
    certificate can be loaded into it once (``sluice.tls_reload``) and reach every connection
    opened after, redis-py's and the lean client's alike. redis-py would otherwise build a
    context per connection object, from the files, and keep it across reconnects.

    The first connection builds it by redis-py's own rules (its URL's ``ssl_*`` options
    included); None until then."""

    def __init__(self) -> None:
        self.context: ssl.SSLContext | None = None

    def get(self, own: RedisSSLContext) -> ssl.SSLContext:
        if self.context is None:
            self.context = own.get()
        return self.context


class _SharedContextMixin:
    ssl_context: RedisSSLContext

    def __init__(self, *args: Any, shared_ssl_context: SharedSslContext, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # RedisSSLContext.get() returns a context it holds: this one, never its own.
        self.ssl_context.context = shared_ssl_context.get(self.ssl_context)


class _SharedContextSSLConnection(_SharedContextMixin, SSLConnection):
    pass


class _SharedContextSentinelSSLConnection(_SharedContextMixin, SentinelManagedSSLConnection):
    pass


def connect(
    url: str,
    *,
    pool_size: int = 16,
    timeout_s: float = 0.1,
    tls: RedisTls | None = None,
    shared_ssl_context: SharedSslContext | None = None,
) -> Redis | RedisCluster:
    """A client for ``url``; nothing connects until the first command. ``shared_ssl_context``:
    every TLS connection uses that one context (not on Cluster, whose nodes redis-py builds
    without a connection class of ours: each new connection there reads the files)."""
    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
    }
    scheme = url.partition("://")[0]
    shared: dict[str, Any] = {}
    if tls is not None and scheme.startswith("rediss"):
        # Only TLS connection classes take these; a plain redis:// URL ignores the files.
        common.update(tls.options())
        if shared_ssl_context is not None:
            shared["shared_ssl_context"] = shared_ssl_context
    if scheme in PLAIN_SCHEMES:
        pool = BlockingConnectionPool.from_url(
            url, max_connections=pool_size, timeout=timeout_s, **common, **shared
        )
        if shared:  # after: the URL's scheme names redis-py's class, and would win
            pool.connection_class = _SharedContextSSLConnection
        return Redis.from_pool(pool)
    if scheme in SENTINEL_SCHEMES:
        if shared:
            shared["connection_class"] = _SharedContextSentinelSSLConnection
        return _sentinel(parse_url(url), pool_size, timeout_s, common, shared)
    if scheme in CLUSTER_SCHEMES:
        parsed = parse_url(url)
        if parsed.path:
            raise ValueError("a redis+cluster:// URL takes no path (Cluster has only DB 0)")
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in parsed.hosts],
            username=parsed.username,
            password=parsed.password,
            ssl=parsed.tls,
            max_connections=pool_size,
            **common,
        )
    raise ValueError(
        f"unsupported Redis URL scheme {scheme!r}: use redis://, rediss://, "
        "redis+sentinel:// or redis+cluster://"
    )


def _sentinel(
    parsed: RedisUrl,
    pool_size: int,
    timeout_s: float,
    common: dict[str, Any],
    shared: dict[str, Any],
) -> Redis:
    if not parsed.path or len(parsed.path) > 2:
        raise ValueError("a redis+sentinel:// URL needs /SERVICE_NAME[/DB] after the hosts")
    service = parsed.path[0]
    try:
        db = int(parsed.path[1]) if len(parsed.path) == 2 else 0
    except ValueError:
        raise ValueError("the DB in a redis+sentinel:// URL must be a number") from None
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(parsed.hosts), sentinel_kwargs={**common, "ssl": parsed.tls}
    )
    master: Redis = sentinel.master_for(
        service,
        connection_pool_class=_BlockingSentinelPool,
        max_connections=pool_size,
        timeout=timeout_s,
        db=db,
        username=parsed.username,
        password=parsed.password,
        ssl=parsed.tls,
        **common,
        **shared,
    )
    return master
