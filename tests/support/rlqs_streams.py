"""Driving RLQS streams by hand: a stream's request side, and reading its responses."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping

from sluice._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2

__all__ = ["Feed", "next_response", "rate", "run", "strategies"]

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


async def next_response(responses: AsyncIterator[Response]) -> Response:
    return await asyncio.wait_for(anext(responses), 2)


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
    [(_, tokens, interval)] = strategies(response).values()  # type: ignore[misc]
    return float(tokens) / float(interval)


def run(test: Callable[..., Coroutine[object, object, None]]) -> Callable[..., None]:
    """The suite has no asyncio plugin: each test runs on a loop of its own."""

    @functools.wraps(test)
    def wrapper(*args: object, **kwargs: object) -> None:
        asyncio.run(test(*args, **kwargs))

    return wrapper
