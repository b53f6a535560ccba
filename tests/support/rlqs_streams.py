"""Driving RLQS streams by hand: a stream's request side, and reading its responses."""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping

from sluice._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from sluice._proto.envoy.type.v3 import ratelimit_strategy_pb2

__all__ = ["Collector", "Feed", "next_response", "rate", "run", "strategies"]

Response = rlqs_pb2.RateLimitQuotaResponse


class Feed:
    """A stream's request side, written by the test."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[rlqs_pb2.RateLimitQuotaUsageReports | None] = asyncio.Queue()

    def report(
        self,
        *usages: tuple[Mapping[str, str], float, int, int],
        domain: str = "",
    ) -> None:
        message = rlqs_pb2.RateLimitQuotaUsageReports(domain=domain)
        for bucket, elapsed, allowed, denied in usages:
            usage = message.bucket_quota_usages.add()
            usage.bucket_id.bucket.update(bucket)
            usage.time_elapsed.FromNanoseconds(int(elapsed * 1e9))
            usage.num_requests_allowed = allowed
            usage.num_requests_denied = denied
        self._queue.put_nowait(message)

    def close(self) -> None:
        self._queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[rlqs_pb2.RateLimitQuotaUsageReports]:
        while (message := await self._queue.get()) is not None:
            yield message


async def next_response(responses: AsyncIterator[bytes]) -> Response:
    """The stream's next response, decoded (it must come within 2 s)."""
    return Response.FromString(await asyncio.wait_for(anext(responses), 2))


def strategies(response: Response) -> dict[tuple[tuple[str, str], ...], object]:
    out: dict[tuple[tuple[str, str], ...], object] = {}
    for action in response.bucket_action:
        key = tuple(sorted(action.bucket_id.bucket.items()))
        strategy = action.quota_assignment_action.rate_limit_strategy
        if strategy.HasField("token_bucket"):
            tb = strategy.token_bucket
            out[key] = (tb.max_tokens, tb.tokens_per_fill.value, tb.fill_interval.seconds)
        else:
            out[key] = strategy.blanket_rule
    return out


def rate(response: Response) -> float:
    """Tokens per second of the one bucket in ``response`` (0 for a DENY_ALL)."""
    [strategy] = strategies(response).values()
    if not isinstance(strategy, tuple):
        return 0.0 if strategy == ratelimit_strategy_pb2.RateLimitStrategy.DENY_ALL else math.inf
    _, tokens, interval = strategy
    return float(tokens) / float(interval)


class Collector:
    """Reads a stream's responses as they come, on a task of its own."""

    def __init__(self, responses: AsyncIterator[bytes]) -> None:
        self.responses: list[Response] = []
        self._arrived = asyncio.Event()
        self._task = asyncio.ensure_future(self._read(responses))

    async def _read(self, responses: AsyncIterator[bytes]) -> None:
        async for response in responses:
            self.responses.append(Response.FromString(response))
            self._arrived.set()

    async def wait(self, count: int) -> None:
        """Until ``count`` responses have come (a report's answer may wait on Redis)."""
        async with asyncio.timeout(5):
            while len(self.responses) < count:
                self._arrived.clear()
                await self._arrived.wait()

    async def settle(self) -> None:
        """Let what the service has queued reach this reader (loop turns, not time)."""
        for _ in range(20):
            await asyncio.sleep(0)

    @property
    def rate(self) -> float:
        return rate(self.responses[-1])

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def run(test: Callable[..., Coroutine[object, object, None]]) -> Callable[..., None]:
    """The suite has no asyncio plugin: each test runs on a loop of its own."""

    @functools.wraps(test)
    def wrapper(*args: object, **kwargs: object) -> None:
        asyncio.run(test(*args, **kwargs))

    return wrapper
