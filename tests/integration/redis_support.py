"""Looking inside a Redis deployment from tests: its data nodes and their command counts."""

from __future__ import annotations

from collections.abc import Iterator

import redis

from sluice.backends.redis.connect import parse_url

__all__ = ["calls", "data_nodes", "evalsha_calls", "reset_stats", "scan_keys"]


def data_nodes(url: str) -> list[redis.Redis]:
    """A plain client per node holding data: the server, the Sentinel's master, or every
    Cluster master."""
    if url.startswith("redis://"):
        return [redis.Redis.from_url(url, socket_timeout=2)]
    parsed = parse_url(url)
    if parsed.scheme == "redis+sentinel":
        host, port = parsed.hosts[0]
        with redis.Redis(host=host, port=port, socket_timeout=2) as sentinel:
            master = sentinel.sentinel_get_master_addr_by_name(parsed.path[0])
        return [redis.Redis(host=master[0], port=int(master[1]), socket_timeout=2)]
    return [redis.Redis(host=host, port=port, socket_timeout=2) for host, port in parsed.hosts]


def reset_stats(nodes: list[redis.Redis]) -> None:
    for node in nodes:
        node.config_resetstat()


def _stats(nodes: list[redis.Redis]) -> Iterator[tuple[str, int]]:
    for node in nodes:
        for name, value in node.info("commandstats").items():
            yield name.removeprefix("cmdstat_"), int(value["calls"])


def evalsha_calls(nodes: list[redis.Redis]) -> int:
    return sum(calls for name, calls in _stats(nodes) if name == "evalsha")


def calls(nodes: list[redis.Redis], *names: str) -> int:
    """Calls of the named commands (``evalsha``, ``script|load``…) summed over ``nodes``.

    Commands a script runs count too, so count the calls a client can make, not GET/SET.
    """
    return sum(n for name, n in _stats(nodes) if name in names)


def scan_keys(nodes: list[redis.Redis], pattern: str) -> list[tuple[redis.Redis, bytes]]:
    return [(node, key) for node in nodes for key in node.scan_iter(match=pattern, count=1000)]
