"""Lease tables in Redis: exact across every instance sharing it, standalone, Sentinel or
Cluster.

One sorted set per descriptor (lease id -> expires_at), changed only by the scripts in
``lua/`` (prelude plus one operation each, atomic), which drop expired leases first, so
expiry needs no sweeper. The key is ``PREFIX{TAG}:lease``: the counter's hash tag
(``backends/redis/keys.py``), so a descriptor's table sits in its counter's Cluster slot and
each script call touches one key.

A circuit breaker (the backend's kind, ``backends/redis/breaker.py``) turns a run of failed
calls into fail-fast ones, so while Redis is down a lease call costs microseconds instead of
the client's timeout; a real call after the cool-down is the probe.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from redis.asyncio import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from sluice.backends.redis.breaker import CLOSED, CircuitBreaker
from sluice.backends.redis.keys import KeyNamer, counter_of_tag
from sluice.errors import BackendUnavailableError
from sluice.leases.store import CounterKey, StoredTable
from sluice.leases.table import Acquired, Held, InFlight

__all__ = ["RedisLeaseStore", "script_source"]

_LUA_DIR = Path(__file__).with_name("lua")
_ERRORS = (RedisError, RedisClusterException, OSError, asyncio.TimeoutError)
_CIRCUIT_OPEN = "Redis unavailable (circuit open)"
_SUFFIX = "}:lease"
BATCH = 100  # tables read in one pipeline when listing: the event loop turns between two
_GLOB = re.compile(r"([*?\[\]\\])")


def script_source(operation: str) -> str:
    """One operation's script: the prelude, then its own file."""
    return "\n".join(
        (_LUA_DIR / f"{name}.lua").read_text(encoding="utf-8") for name in ("prelude", operation)
    )


class RedisLeaseStore:
    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = "sluice:",
        server_time: bool = True,
        max_concurrent_calls: int = 16,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        """``client``: a ``redis.asyncio`` Redis or RedisCluster. ``server_time``: decide
        expiry on Redis's clock (what instances sharing it agree on) rather than the
        caller's ``now`` (tests step an injected one). ``max_concurrent_calls``: what the
        client's pool holds (a Cluster client refuses a call past its per-node pool, where
        waiting for a connection is what is wanted)."""
        self._client = client
        self.breaker = breaker or CircuitBreaker()
        self._calls = asyncio.Semaphore(max_concurrent_calls)
        self._cluster = isinstance(client, RedisCluster)
        self._learning = asyncio.Lock()
        self._names = KeyNamer(key_prefix)
        self._server_time = server_time
        self._acquire = client.register_script(script_source("acquire"))
        self._renew = client.register_script(script_source("renew"))
        self._release = client.register_script(script_source("release"))
        self._in_flight = client.register_script(script_source("in_flight"))

    def key(self, counter_key: CounterKey) -> str:
        return f"{self._names.base(counter_key)}lease"

    def _now(self, now: float) -> str:
        return "" if self._server_time else repr(float(now))

    async def _call(self, script: Any, key: CounterKey, *args: str) -> Any:
        breaker = self.breaker
        if not breaker.acquire():
            raise BackendUnavailableError(_CIRCUIT_OPEN)
        probe = breaker.state != CLOSED
        try:
            if self._cluster:
                # redis-py's cluster client learns the topology lazily, and calls that start
                # while it does close connections under each other (see RedisBackend's
                # _send_cluster): learn it alone first (a no-op once known).
                async with self._learning:
                    await self._client.initialize()
            async with self._calls:
                reply = await script(keys=[self.key(key)], args=list(args))
        except _ERRORS as exc:
            breaker.failure()
            raise BackendUnavailableError(f"Redis: {type(exc).__name__}: {exc}") from exc
        except asyncio.CancelledError:
            if probe:  # the probe never finished: keep failing fast, probe again later
                breaker.failure()
            raise
        breaker.success()
        return reply

    async def acquire(
        self, key: CounterKey, lease_id: str, *, max_leases: int, ttl_s: float, now: float
    ) -> Acquired:
        reply = await self._call(
            self._acquire, key, self._now(now), lease_id, str(max_leases), repr(float(ttl_s))
        )
        return Acquired(bool(reply[0]), int(reply[1]), float(reply[2]))

    async def renew(self, key: CounterKey, lease_id: str, *, ttl_s: float, now: float) -> bool:
        reply = await self._call(self._renew, key, self._now(now), lease_id, repr(float(ttl_s)))
        return bool(reply)

    async def release(self, key: CounterKey, lease_id: str, *, now: float) -> bool:
        return bool(await self._call(self._release, key, self._now(now), lease_id))

    async def in_flight(self, keys: Sequence[CounterKey], *, now: float) -> list[InFlight]:
        # One call per key: on Cluster each descriptor's table may sit on another master.
        replies = await asyncio.gather(
            *(self._call(self._in_flight, key, self._now(now)) for key in keys)
        )
        return [InFlight(int(reply[0]), float(reply[1])) for reply in replies]

    async def list_tables(self, *, now: float) -> AsyncIterator[list[StoredTable]]:
        # SCAN finds the tables (on every master of a Cluster); each batch is then read in
        # one pipeline, without scripts: listing prunes nothing and changes no lease.
        pattern = _GLOB.sub(r"\\\1", self._names.prefix) + "{*" + _SUFFIX
        try:
            if self._cluster:
                async with self._learning:
                    await self._client.initialize()
            if self._server_time:
                seconds, micros = await self._client.time()
                now = seconds + micros / 1_000_000
            keys: list[str] = []
            seen: set[bytes] = set()  # SCAN may return a key twice
            async for key in self._client.scan_iter(match=pattern, count=1000, _type="zset"):
                if key in seen:
                    continue
                seen.add(key)
                keys.append(key.decode("utf-8", "surrogateescape"))
                if len(keys) == BATCH:
                    yield await self._read(keys, now)
                    keys = []
            if keys:
                yield await self._read(keys, now)
        except _ERRORS as exc:
            raise BackendUnavailableError(f"Redis: {type(exc).__name__}: {exc}") from exc

    async def _read(self, keys: list[str], now: float) -> list[StoredTable]:
        after = f"({now!r}"  # held while now < expires_at
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.zcount(key, after, "+inf")
            pipe.zrangebyscore(key, after, "+inf", start=0, num=1, withscores=True)
            pipe.zrevrangebyscore(key, "+inf", after, start=0, num=1, withscores=True)
        async with self._calls:
            replies = await pipe.execute()
        tables = []
        for i, key in enumerate(keys):
            count, first, last = replies[3 * i : 3 * i + 3]
            if count and first and last:  # a release between the reads may empty it
                held = Held(int(count), first[0][1] - now, last[0][1] - now)
                tag = key[len(self._names.prefix) + 1 : -len(_SUFFIX)]
                tables.append(StoredTable(counter_of_tag(tag), held, key))
        return tables

    async def close(self) -> None:
        await self._client.aclose()
