"""How instances learn each other's demand on a bucket (shares.py divides by the sum).

With the memory backend an instance is alone: its own streams are every stream
(``LocalExchange``). With Redis (``RedisExchange``) each instance writes, once per rebalance,
its streams' demand and count on each bucket into one hash per bucket, a field per instance
stamped with Redis's own clock, and reads back the sum over the fields younger than the
``ttl_s``: an instance that stops (or loses a bucket's streams) drops out of the sum within
it. One script call per bucket does both atomically; the hash sits in the bucket's counter
hash slot, so it works unchanged on Redis Cluster.

When Redis cannot be reached the last sums it gave are kept (raised to this instance's own
figures where those grew), so a Redis outage never hands every instance the whole limit.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from sluice.backends.redis.keys import counter_tag
from sluice.rlqs.shares import Totals

__all__ = ["DemandExchange", "LocalExchange", "RedisExchange"]

log = logging.getLogger(__name__)

ShareKey = tuple[str, ...]

_SCRIPT = """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], now_ms .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])
redis.call('PEXPIRE', KEYS[1], ttl)
local fields = redis.call('HGETALL', KEYS[1])
local demand, streams = 0, 0
for i = 1, #fields, 2 do
  local t, d, s = string.match(fields[i + 1], '(%S+) (%S+) (%S+)')
  if now_ms - tonumber(t) > ttl then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    demand = demand + tonumber(d)
    streams = streams + tonumber(s)
  end
end
return {tostring(demand), streams}
"""


class DemandExchange(Protocol):
    async def exchange(self, local: Mapping[ShareKey, Totals]) -> dict[ShareKey, Totals]:
        """Publish this instance's totals per bucket; the totals over every instance."""
        ...

    async def close(self) -> None: ...


class LocalExchange:
    """One instance holds every stream: its totals are the totals."""

    async def exchange(self, local: Mapping[ShareKey, Totals]) -> dict[ShareKey, Totals]:
        return dict(local)

    async def close(self) -> None:
        pass


class RedisExchange:
    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = "sluice:",
        ttl_s: float = 3.0,
        instance: str | None = None,
        max_concurrent_calls: int = 8,
    ) -> None:
        self._client = client
        self._script = client.register_script(_SCRIPT)
        self._prefix = key_prefix
        self._ttl_ms = round(ttl_s * 1000)
        self.instance = instance or uuid.uuid4().hex
        self._cluster = isinstance(client, RedisCluster)
        self._limit = asyncio.Semaphore(max_concurrent_calls)
        self._last: dict[ShareKey, Totals] = {}
        self.failures = 0

    def key(self, share_key: ShareKey) -> str:
        return f"{self._prefix}{{{counter_tag(share_key)}}}:rlqs"

    async def exchange(self, local: Mapping[ShareKey, Totals]) -> dict[ShareKey, Totals]:
        keys = list(local)
        try:
            if self._cluster:
                replies = await asyncio.gather(*(self._call(k, local[k]) for k in keys))
            else:
                replies = await self._pipelined(keys, local)
        except (TimeoutError, RedisError, OSError) as exc:
            self.failures += 1
            if self.failures == 1 or self.failures % 60 == 0:
                log.warning(
                    "RLQS demand exchange through Redis failed (%d times): %s", self.failures, exc
                )
            return {k: _at_least(self._last.get(k), local[k]) for k in keys}
        totals = {
            k: _at_least(Totals(float(demand), int(streams)), local[k])
            for k, (demand, streams) in zip(keys, replies, strict=True)
        }
        self._last = totals
        return totals

    async def _pipelined(self, keys: list[ShareKey], local: Mapping[ShareKey, Totals]) -> Any:
        if not keys:
            return []
        async with self._client.pipeline(transaction=False) as pipe:
            for k in keys:
                await self._script(keys=[self.key(k)], args=self._args(local[k]), client=pipe)
            return await pipe.execute()

    async def _call(self, key: ShareKey, totals: Totals) -> Any:
        async with self._limit:
            return await self._script(keys=[self.key(key)], args=self._args(totals))

    def _args(self, totals: Totals) -> list[str | int]:
        return [self.instance, self._ttl_ms, repr(totals.demand), totals.streams]

    async def close(self) -> None:
        await self._client.aclose()


def _at_least(known: Totals | None, local: Totals) -> Totals:
    """The global totals can never be below this instance's own share of them."""
    if known is None:
        return local
    return Totals(max(known.demand, local.demand), max(known.streams, local.streams))
