"""How instances split a limit between them (shares.py splits each instance's part).

Each instance claims a bucket's limit by the weight of its streams on it, and is granted the
fraction that weight is of every instance's, but never more than the others' grants leave
free: an instance whose demand grew takes its larger part only once the others have given
theirs back, so the grants never add up to more than the whole limit, whatever order the
instances rebalance in. Demand that moves between instances moves its share within two
rebalances.

With the memory backend an instance is alone and is granted everything (``LocalExchange``).
With Redis (``RedisExchange``) one script call per bucket, atomic, reads the other instances'
weights and grants, computes this instance's grant and records it with its weight, in one
hash per bucket (a field per instance, stamped by Redis's own clock); fields older than
``ttl_s`` are dropped, so an instance that stops frees its part within it. The hash sits in
the bucket's counter hash slot, so this works unchanged on Redis Cluster.

When Redis cannot be reached an instance keeps the grants it last had (a bucket it has no
grant for yet gets the whole limit, as a data plane without Sluice would), and logs it.
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

__all__ = ["DemandExchange", "LocalExchange", "RedisExchange"]

log = logging.getLogger(__name__)

ShareKey = tuple[str, ...]

_SCRIPT = """
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local ttl = tonumber(ARGV[2])
local weight = tonumber(ARGV[3])
local fields = redis.call('HGETALL', KEYS[1])
local total, taken = weight, 0
for i = 1, #fields, 2 do
  if fields[i] ~= ARGV[1] then
    local t, w, g = string.match(fields[i + 1], '(%S+) (%S+) (%S+)')
    if now_ms - tonumber(t) > ttl then
      redis.call('HDEL', KEYS[1], fields[i])
    else
      total = total + tonumber(w)
      taken = taken + tonumber(g)
    end
  end
end
local grant = 1
if total > 0 then grant = weight / total end
grant = math.min(grant, math.max(0, 1 - taken))
local text = string.format('%.17g', grant)
redis.call('HSET', KEYS[1], ARGV[1], now_ms .. ' ' .. ARGV[3] .. ' ' .. text)
redis.call('PEXPIRE', KEYS[1], ttl)
return text
"""


class DemandExchange(Protocol):
    async def exchange(self, weights: Mapping[ShareKey, float]) -> dict[ShareKey, float]:
        """This instance's streams' weight per bucket in; the fraction of each bucket's
        limit granted to this instance out."""
        ...

    async def close(self) -> None: ...


class LocalExchange:
    """One instance holds every stream: it is granted every limit whole."""

    async def exchange(self, weights: Mapping[ShareKey, float]) -> dict[ShareKey, float]:
        return dict.fromkeys(weights, 1.0)

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
        self._last: dict[ShareKey, float] = {}
        self.failures = 0

    def key(self, share_key: ShareKey) -> str:
        return f"{self._prefix}{{{counter_tag(share_key)}}}:rlqs"

    async def exchange(self, weights: Mapping[ShareKey, float]) -> dict[ShareKey, float]:
        keys = list(weights)
        try:
            if self._cluster:
                replies = await asyncio.gather(*(self._call(k, weights[k]) for k in keys))
            else:
                replies = await self._pipelined(keys, weights)
        except (TimeoutError, RedisError, OSError) as exc:
            self.failures += 1
            if self.failures == 1 or self.failures % 60 == 0:
                log.warning(
                    "RLQS: Redis unreachable for the share exchange (%d times); keeping the "
                    "last grants: %s",
                    self.failures,
                    exc,
                )
            return {k: self._last.get(k, 1.0) for k in keys}
        grants = {k: float(reply) for k, reply in zip(keys, replies, strict=True)}
        if len(self._last) > 2 * len(grants) + 1024:
            self._last = {}  # forget buckets gone since (a rebalance passes every live one)
        self._last.update(grants)
        return grants

    async def _pipelined(self, keys: list[ShareKey], weights: Mapping[ShareKey, float]) -> Any:
        if not keys:
            return []
        async with self._client.pipeline(transaction=False) as pipe:
            for k in keys:
                await self._script(keys=[self.key(k)], args=self._args(weights[k]), client=pipe)
            return await pipe.execute()

    async def _call(self, key: ShareKey, weight: float) -> Any:
        async with self._limit:
            return await self._script(keys=[self.key(key)], args=self._args(weight))

    def _args(self, weight: float) -> list[str | int]:
        return [self.instance, self._ttl_ms, repr(weight)]

    async def close(self) -> None:
        await self._client.aclose()
