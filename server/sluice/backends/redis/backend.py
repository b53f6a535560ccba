"""The Redis backend: every hit decided by one atomic script call, and concurrent requests
sharing round trips.

Batching (auto-pipelining): ``apply`` queues its hits and waits. The first call in an
event-loop tick schedules a flush for the end of that tick, so every call issued in the same
tick joins one batch; while a batch is in flight (at most ``max_in_flight`` of them), new
calls keep queueing and leave together when it returns. A Python-side round trip costs far
more than the script (hundreds of microseconds of CPU), so under load many requests share one.
A batch is one script call (standalone, Sentinel), or on Redis Cluster one call per hash
slot, issued concurrently (redis-py cannot put scripts in a cluster pipeline). Each
request's outcomes are routed back to its caller; a failed call fails only the requests it
carried.

Time: by default the script reads Redis's clock (``server_time``), so several Sluice
instances with skewed clocks agree on window boundaries; otherwise a batch uses the latest
``now`` its requests brought (they are concurrent, so any of them is as right as another).

Failures: connection errors, timeouts and Redis error replies become
BackendUnavailableError; a circuit breaker turns a run of them into fail-fast answers that
touch no socket until a probe succeeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError

from sluice.algorithms import Outcome
from sluice.backends import Hit
from sluice.backends.redis.breaker import CLOSED, CircuitBreaker
from sluice.backends.redis.keys import KeyNamer
from sluice.backends.redis.scripts import ApplyScript
from sluice.errors import BackendUnavailableError

__all__ = ["RedisBackend"]

log = logging.getLogger("sluice.redis")

_Outcomes = list[tuple[Outcome, ...]]
_ERRORS = (RedisError, RedisClusterException, OSError, asyncio.TimeoutError)


class _Request:
    __slots__ = ("future", "hits", "keys", "now")

    def __init__(
        self, hits: Sequence[Hit], keys: list[list[str]], now: float, future: asyncio.Future
    ) -> None:
        self.hits = hits
        self.keys = keys  # per hit, the state key of each limit
        self.now = now
        self.future = future


class RedisBackend:
    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = "sluice:",
        server_time: bool = True,
        max_in_flight: int = 1,
        max_batch_hits: int = 1024,
        max_concurrent_calls: int = 16,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        if max_in_flight < 1 or max_batch_hits < 1 or max_concurrent_calls < 1:
            raise ValueError("max_in_flight, max_batch_hits and max_concurrent_calls must be >= 1")
        self._client = client
        self._script = ApplyScript(client)
        self._names = KeyNamer(key_prefix)
        self._cluster = isinstance(client, RedisCluster)
        self._server_time = server_time
        self._max_in_flight = max_in_flight
        self._max_batch_hits = max_batch_hits
        # Cluster calls go out per slot; this bounds them to what the per-node pools hold.
        self._calls = asyncio.Semaphore(max_concurrent_calls)
        self.breaker = breaker or CircuitBreaker()
        self._pending: list[_Request] = []
        self._flush_scheduled = False
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()
        # Counters for metrics and tests.
        self.round_trips = 0
        self.script_calls = 0
        self.requests = 0
        self.failures = 0
        self.fast_failures = 0

    async def apply(self, hits: Sequence[Hit], now: float) -> list[tuple[Outcome, ...]]:
        if not hits:
            return []
        if self.breaker.rejects():
            self.fast_failures += 1
            raise BackendUnavailableError("Redis unavailable (circuit open)")
        names = self._names
        keys = [names.keys(hit.counter_key, hit.limits) for hit in hits]
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append(_Request(hits, keys, now, future))
        self.requests += 1
        if not self._flush_scheduled and self._in_flight < self._max_in_flight:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return await future

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._fail(self._pending, BackendUnavailableError("Redis backend closed"))
        self._pending = []
        await self._client.aclose()

    def _flush(self) -> None:
        self._flush_scheduled = False
        while self._pending and self._in_flight < self._max_in_flight:
            batch = self._take_batch()
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._sent)

    def _take_batch(self) -> list[_Request]:
        # Whole requests only; a request bigger than the cap still goes (alone).
        taken, size = 0, 0
        for request in self._pending:
            if taken and size + len(request.hits) > self._max_batch_hits:
                break
            taken += 1
            size += len(request.hits)
        batch, self._pending = self._pending[:taken], self._pending[taken:]
        return batch

    def _sent(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._in_flight -= 1
        if self._pending and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def _send(self, batch: list[_Request]) -> None:
        # Callers that gave up (a cancelled gRPC call) need no answer and no counting.
        batch = [r for r in batch if not r.future.done()]
        if not batch:
            return
        if not self.breaker.acquire():
            # Queued before the breaker opened: fail now rather than wait out a timeout.
            self.fast_failures += len(batch)
            self._fail(batch, BackendUnavailableError("Redis unavailable (circuit open)"))
            return
        now = None if self._server_time else max(r.now for r in batch)
        self.round_trips += 1
        try:
            if self._cluster:
                ok = await self._send_cluster(batch, now)
            else:
                ok = await self._send_one(batch, now)
        except Exception as exc:  # a bug, not an outage: every caller sees it, the log too
            log.exception("Redis backend: unexpected error")
            self._fail(batch, exc)
            return
        if ok:
            if self.breaker.state != CLOSED:
                log.warning("Redis reachable again: deciding with it")
            self.breaker.success()
        else:
            self.failures += 1
            opened = self.breaker.opened
            self.breaker.failure()
            if self.breaker.opened != opened:
                log.warning(
                    "Redis unreachable: failing fast for %.1fs (failure mode decides the answers)",
                    self.breaker.cooldown_s,
                )

    async def _send_one(self, batch: list[_Request], now: float | None) -> bool:
        hits = [hit for r in batch for hit in r.hits]
        keys = [key for r in batch for per_hit in r.keys for key in per_hit]
        self.script_calls += 1
        try:
            outcomes = await self._script(keys, hits, now)
        except _ERRORS as exc:
            self._fail(batch, _unavailable(exc))
            return False
        start = 0
        for r in batch:
            end = start + len(r.hits)
            if not r.future.done():
                r.future.set_result(outcomes[start:end])
            start = end
        return True

    async def _send_cluster(self, batch: list[_Request], now: float | None) -> bool:
        # slot -> hits, their keys, and where each hit's outcome goes (request, hit index).
        groups: dict[int, tuple[list[Hit], list[str], list[tuple[int, int]]]] = {}
        for n, r in enumerate(batch):
            for i, (hit, keys) in enumerate(zip(r.hits, r.keys, strict=True)):
                slot = key_slot(keys[0].encode()) if keys else 0
                hits, flat, where = groups.setdefault(slot, ([], [], []))
                hits.append(hit)
                flat.extend(keys)
                where.append((n, i))
        results = await asyncio.gather(
            *(self._call(hits, keys, now) for hits, keys, _ in groups.values())
        )
        answers: list[list[tuple[Outcome, ...] | None]] = [[None] * len(r.hits) for r in batch]
        failed: dict[int, BaseException] = {}
        for (_, _, where), result in zip(groups.values(), results, strict=True):
            for j, (n, i) in enumerate(where):
                if isinstance(result, BaseException):
                    failed[n] = result
                else:
                    answers[n][i] = result[j]
        for n, r in enumerate(batch):
            if r.future.done():
                continue
            if n in failed:
                r.future.set_exception(_unavailable(failed[n]))
            else:
                r.future.set_result(answers[n])
        return not failed

    async def _call(
        self, hits: list[Hit], keys: list[str], now: float | None
    ) -> _Outcomes | BaseException:
        self.script_calls += 1
        async with self._calls:
            try:
                return await self._script(keys, hits, now)
            except _ERRORS as exc:
                return exc

    @staticmethod
    def _fail(batch: Sequence[_Request], exc: BaseException) -> None:
        for r in batch:
            if not r.future.done():
                r.future.set_exception(exc)


def _unavailable(exc: BaseException) -> BackendUnavailableError:
    # redis-py's messages name host and port, never the password.
    error = BackendUnavailableError(f"Redis: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
