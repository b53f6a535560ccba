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

The client path: standalone and Sentinel calls go through ``wire.ScriptConnection`` (EVALSHA
bytes written directly on one pipelined connection, hiredis parsing the replies), built from
the redis-py client's own settings; Cluster calls, and any deployment the lean path cannot
serve (``lean_client=False``, a Unix socket), go through redis-py.

Time: by default the script reads Redis's clock (``server_time``), so several Sluice
instances with skewed clocks agree on window boundaries; otherwise a batch uses the latest
``now`` its requests brought (they are concurrent, so any of them is as right as another).

Failures: connection errors, timeouts and Redis error replies become
BackendUnavailableError; a circuit breaker turns a run of them into fail-fast answers that
touch no socket until a probe succeeds. Whatever happens inside a call, each caller has its
answer within ``answer_timeout_s`` (by default three socket timeouts of the client): past it,
BackendUnavailableError, and the call's late result is dropped.

Redis Cluster: one breaker per master (as the client's slot table names it), so a dead master
fails only its own slots while the others keep deciding; its slots come back as soon as the
table names the replica that took over (redis-py refreshes the table after any failed call,
and the dead master's probe fails every cool-down). ``breaker`` guards the refresh itself,
done once per batch before the calls fan out: it fails only when no node answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError

from sluice.algorithms import Outcome
from sluice.backends import Hit
from sluice.backends.redis.breaker import CLOSED, CircuitBreaker
from sluice.backends.redis.keys import KeyNamer
from sluice.backends.redis.scripts import SCRIPT_SOURCE, ApplyScript, LeanApplyScript
from sluice.backends.redis.wire import ScriptConnection
from sluice.errors import BackendUnavailableError

__all__ = ["RedisBackend"]

log = logging.getLogger("sluice.redis")

_Outcomes = list[tuple[Outcome, ...]]
_ERRORS = (RedisError, RedisClusterException, OSError, asyncio.TimeoutError)
_CIRCUIT_OPEN = "Redis unavailable (circuit open)"


class _Request:
    __slots__ = ("future", "hits", "keys", "now")

    def __init__(
        self,
        hits: Sequence[Hit],
        keys: list[list[str]],
        now: float,
        future: asyncio.Future[list[tuple[Outcome, ...]]],
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
        answer_timeout_s: float | None = None,
        lean_client: bool = True,
    ) -> None:
        """``lean_client``: standalone and Sentinel script calls on ``wire.ScriptConnection``
        rather than through ``client`` (which still serves Cluster and Sentinel discovery)."""
        if max_in_flight < 1 or max_batch_hits < 1 or max_concurrent_calls < 1:
            raise ValueError("max_in_flight, max_batch_hits and max_concurrent_calls must be >= 1")
        self._client = client
        self._names = KeyNamer(key_prefix)
        self._cluster = isinstance(client, RedisCluster)
        lean = (
            ScriptConnection.from_client(client, SCRIPT_SOURCE)
            if lean_client and not self._cluster
            else None
        )
        self.lean_connection = lean
        self._script: ApplyScript | LeanApplyScript = (
            LeanApplyScript(lean) if lean is not None else ApplyScript(client)
        )
        self._server_time = server_time
        self._max_in_flight = max_in_flight
        self._max_batch_hits = max_batch_hits
        # Cluster calls go out per slot; this bounds them to what the per-node pools hold.
        self._calls = asyncio.Semaphore(max_concurrent_calls)
        self.breaker = breaker or CircuitBreaker()
        self._node_breakers: dict[str, CircuitBreaker] = {}  # Cluster: per master, by name
        # Each caller's answer within this, whatever the client library does inside a call
        # (redis-py's cluster client sleeps and rediscovers the topology in there).
        self._answer_timeout_s = (
            answer_timeout_s if answer_timeout_s is not None else _answer_budget_s(client)
        )
        self._pending: list[_Request] = []
        self._flush_scheduled = False
        self._in_flight = 0
        # The loop of the requests pending or in flight. asyncio.get_running_loop() makes a
        # getpid() system call on Python 3.11 (a check for forks): 8 % of the event loop's
        # busy time under load (native profile, docs/benchmarks.md). While anything is
        # pending or in flight, every caller is necessarily on that loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Callers still waiting, oldest first, with the time their answer is due.
        self._deadlines: deque[tuple[float, asyncio.Future[_Outcomes]]] = deque()
        self._watchdog: asyncio.TimerHandle | None = None
        # Counters for metrics and tests.
        self.round_trips = 0
        self.script_calls = 0
        self.requests = 0
        self.failures = 0
        self.fast_failures = 0
        self.late_answers = 0  # callers answered "unavailable" when the budget ran out

    async def apply(self, hits: Sequence[Hit], now: float) -> list[tuple[Outcome, ...]]:
        if not hits:
            return []
        if self.breaker.rejects():
            self.fast_failures += 1
            raise BackendUnavailableError(_CIRCUIT_OPEN)
        names = self._names
        keys = [names.keys(hit.counter_key, hit.limits) for hit in hits]
        loop = self._loop
        if loop is None or not (self._pending or self._in_flight):
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[list[tuple[Outcome, ...]]] = loop.create_future()
        self._pending.append(_Request(hits, keys, now, future))
        self.requests += 1
        if not self._flush_scheduled and self._in_flight < self._max_in_flight:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        if self._answer_timeout_s is not None:
            # The call carrying this request goes on (its result, if any, is dropped): only
            # the wait ends. Deadlines come in order (one budget, a monotonic clock), so one
            # timer for the oldest serves them all: a timer per request cost more than the
            # lean client path itself (heap pushes, and cancelled timers to pop).
            deadline = loop.time() + self._answer_timeout_s
            self._deadlines.append((deadline, future))
            if self._watchdog is None:
                self._watchdog = loop.call_at(deadline, self._expire_due)
        return await future

    def _expire_due(self) -> None:
        """Answer "unavailable" to every caller past its deadline; wait for the next one."""
        self._watchdog = None
        loop = asyncio.get_running_loop()
        now, deadlines = loop.time(), self._deadlines
        while deadlines:
            deadline, future = deadlines[0]
            if not future.done() and deadline > now:
                self._watchdog = loop.call_at(deadline, self._expire_due)
                return
            deadlines.popleft()
            self._expire(future)

    def _expire(self, future: asyncio.Future[list[tuple[Outcome, ...]]]) -> None:
        if not future.done():
            self.late_answers += 1
            budget_ms = (self._answer_timeout_s or 0.0) * 1000
            future.set_exception(
                BackendUnavailableError(f"Redis: no answer within {budget_ms:.0f} ms")
            )

    @property
    def circuit_open(self) -> bool:
        """Some decisions fail fast: the breaker, or on Cluster a master's, is not closed."""
        breakers = (self.breaker, *self._node_breakers.values())
        return any(b.state != CLOSED for b in breakers)

    def metric_values(self) -> dict[str, float]:
        values = {
            "redis_round_trips": self.round_trips,
            "redis_script_calls": self.script_calls,
            "redis_fast_failures": self.fast_failures,
            "redis_late_answers": self.late_answers,
            "redis_circuit_open": float(self.circuit_open),
        }
        lean = self.lean_connection
        if lean is not None:
            # The decisions' connection (statsd: upstream's ratelimit.redis_pool.cx_*).
            open_now = int(lean.connected)
            values["redis_connections"] = open_now
            values["redis_connections_opened"] = lean.connects
            values["redis_connections_closed"] = lean.connects - open_now
        return values

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._fail(self._pending, BackendUnavailableError("Redis backend closed"))
        self._pending = []
        if self.lean_connection is not None:
            await self.lean_connection.aclose()
        await self._client.aclose()

    def _flush(self) -> None:
        self._flush_scheduled = False
        while self._pending and self._in_flight < self._max_in_flight:
            batch = self._take_batch()
            self._in_flight += 1
            task = self._running_loop().create_task(self._send(batch))
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

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._in_flight -= 1
        if self._pending and not self._flush_scheduled:
            self._flush_scheduled = True
            self._running_loop().call_soon(self._flush)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop of the batches (set by ``apply``, which every batch starts from)."""
        return self._loop if self._loop is not None else asyncio.get_running_loop()

    async def _send(self, batch: list[_Request]) -> None:
        # Callers that gave up (a cancelled gRPC call) need no answer and no counting.
        batch = [r for r in batch if not r.future.done()]
        if not batch:
            return
        if not self._cluster and not self.breaker.acquire():
            # Queued before the breaker opened: fail now rather than wait out a timeout.
            self.fast_failures += len(batch)
            self._fail(batch, BackendUnavailableError(_CIRCUIT_OPEN))
            return
        # Calendar windows are laid out from Sluice's clock even when Redis's decides.
        at = max(r.now for r in batch)
        now = None if self._server_time else at
        try:
            if self._cluster:
                await self._send_cluster(batch, now, at)  # breakers per master, in there
                return
            self.round_trips += 1
            ok = await self._send_one(batch, now, at)
        except Exception as exc:  # a bug, not an outage: every caller sees it, the log too
            log.exception("Redis backend: unexpected error")
            self._fail(batch, exc)
            return
        self._settle(self.breaker, ok, "Redis")

    def _settle(self, breaker: CircuitBreaker, ok: bool, what: str) -> None:
        """Tell ``breaker`` how a call went; log when it opens and when it closes again."""
        if ok:
            if breaker.state != CLOSED:
                log.warning("%s reachable again: deciding with it", what)
            breaker.success()
            return
        self.failures += 1
        opened = breaker.opened
        breaker.failure()
        if breaker.opened != opened:
            log.warning(
                "%s unreachable: failing fast for %.1fs (failure mode decides the answers)",
                what,
                breaker.cooldown_s,
            )

    async def _send_one(self, batch: list[_Request], now: float | None, at: float) -> bool:
        hits = [hit for r in batch for hit in r.hits]
        keys = [key for r in batch for per_hit in r.keys for key in per_hit]
        self.script_calls += 1
        try:
            outcomes = await self._script(keys, hits, now, at=at)
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

    async def _send_cluster(self, batch: list[_Request], now: float | None, at: float) -> None:
        # redis-py's cluster client learns the topology lazily, and commands that start
        # together while it does (on first use, and after it dropped every connection, as it
        # does on CLUSTERDOWN) close connections under each other: ConnectionError, even
        # AttributeError. So learn it here, alone, before the calls fan out (a no-op when
        # known). ``breaker`` guards this step: it fails when no node can be reached.
        if not self.breaker.acquire():
            self.fast_failures += len(batch)
            self._fail(batch, BackendUnavailableError(_CIRCUIT_OPEN))
            return
        try:
            await self._client.initialize()
        except _ERRORS as exc:
            self._fail(batch, _unavailable(exc))
            self._settle(self.breaker, False, "Redis")
            return
        self._settle(self.breaker, True, "Redis")
        # slot -> hits, their keys, and where each hit's outcome goes (request, hit index).
        groups: dict[int, tuple[list[Hit], list[str], list[tuple[int, int]]]] = {}
        for n, r in enumerate(batch):
            for i, (hit, keys) in enumerate(zip(r.hits, r.keys, strict=True)):
                slot = key_slot(keys[0].encode()) if keys else 0
                hits, flat, where = groups.setdefault(slot, ([], [], []))
                hits.append(hit)
                flat.extend(keys)
                where.append((n, i))
        calls, sent = [], 0
        for hits, keys, _ in groups.values():
            node, breaker = self._node_breaker(keys[0] if keys else None)
            # One probe per master when its cool-down is over; its other slots fail fast.
            if breaker.acquire():
                calls.append(self._call(node, breaker, hits, keys, now, at))
                sent += 1
            else:
                calls.append(_circuit_open())
        self.round_trips += sent > 0
        results = await asyncio.gather(*calls)
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
            if n not in failed:
                # Every hit of a request that did not fail was answered by its call.
                r.future.set_result(cast(list[tuple[Outcome, ...]], answers[n]))
            elif isinstance(failed[n], BackendUnavailableError):  # failed fast
                self.fast_failures += 1
                r.future.set_exception(failed[n])
            else:
                r.future.set_exception(_unavailable(failed[n]))

    def _node_breaker(self, key: str | None) -> tuple[str, CircuitBreaker]:
        """The master serving ``key`` as the client's slot table says, and its breaker (what
        to call it in the log); ``breaker`` when the table names none (or there is no key)."""
        try:
            node = self._client.get_node_from_key(key) if key is not None else None
        except RedisClusterException:  # the slot is not (yet) in the table
            node = None
        if node is None:
            return "Redis", self.breaker
        breaker = self._node_breakers.get(node.name)
        if breaker is None:
            breaker = self._node_breakers[node.name] = self.breaker.sibling()
        return f"Redis node {node.name}", breaker

    async def _call(
        self,
        node: str,
        breaker: CircuitBreaker,
        hits: list[Hit],
        keys: list[str],
        now: float | None,
        at: float,
    ) -> _Outcomes | BaseException:
        self.script_calls += 1
        async with self._calls:
            try:
                outcomes = await self._script(keys, hits, now, at=at)
            except _ERRORS as exc:
                self._settle(breaker, False, node)
                return exc
        self._settle(breaker, True, node)
        return outcomes

    @staticmethod
    def _fail(batch: Sequence[_Request], exc: BaseException) -> None:
        for r in batch:
            if not r.future.done():
                r.future.set_exception(exc)


def _answer_budget_s(client: Any) -> float | None:
    """Three of the client's socket timeouts (pool wait, connect, read), if it has one."""
    holder = getattr(client, "nodes_manager", None) or getattr(client, "connection_pool", None)
    timeout = getattr(holder, "connection_kwargs", {}).get("socket_timeout")
    return 3 * timeout if isinstance(timeout, int | float) and timeout > 0 else None


async def _circuit_open() -> BackendUnavailableError:
    return BackendUnavailableError(_CIRCUIT_OPEN)


def _unavailable(exc: BaseException) -> BackendUnavailableError:
    # redis-py's messages name host and port, never the password.
    error = BackendUnavailableError(f"Redis: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
