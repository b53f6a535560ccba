"""A steady gRPC load on a `sluice serve`, every answer recorded with its timing, and the
questions the fault tests ask of the record.

Each stream sends ShouldRateLimit calls for one descriptor key, cycling through its values,
from a few concurrent workers at a paced rate, each call with a client deadline. A *gated*
stream sends only in the middle of each wall-clock second (``GATE``), so every answer it gets
falls inside one one-second window: the fixed window a decision counted in is known from the
client's clock alone (Redis's ``TIME`` reads the same clock on this machine).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import grpc

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

__all__ = ["GATE", "Answer", "SteadyLoad", "Stream", "kinds", "window_counts"]

# A gated stream sends when the fraction of the current second is in [start, end): answers
# (a few milliseconds) land before the window ends, the next window starts afresh.
GATE = (0.02, 0.85)


@dataclass(frozen=True)
class Stream:
    name: str
    key: str  # the descriptor's one entry key
    values: tuple[str, ...]  # cycled through, call by call
    rate_per_s: float
    workers: int = 4
    gated: bool = False


@dataclass(frozen=True)
class Answer:
    stream: str
    value: str
    started: float  # wall clock, time.time(), when the call was made
    ended: float  # wall clock when its answer (or error) arrived
    latency_s: float  # monotonic
    kind: str  # "OK" / "OVER_LIMIT" (the overall code), or the gRPC status code's name
    has_limit: bool  # the status names the limit that decided it
    remaining: int
    reset_s: float  # duration_until_reset
    details: str  # the error's details, "" for an answer

    @property
    def decided(self) -> bool:
        """An answer from counted state, not from the failure mode: it names its limit, and a
        refusal says when it ends (the failure mode's own refusal says 0)."""
        if self.kind == "OK":
            return self.has_limit
        return self.kind == "OVER_LIMIT" and self.has_limit and self.reset_s > 0


class SteadyLoad:
    """``async with SteadyLoad(target, streams, deadline_s=…) as load:`` runs the load until
    the block ends; ``load.answers`` grows as answers arrive."""

    def __init__(
        self, target: str, streams: Sequence[Stream], *, domain: str, deadline_s: float
    ) -> None:
        self.target = target
        self.streams = streams
        self.domain = domain
        self.deadline_s = deadline_s
        self.answers: list[Answer] = []
        self._stop = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> SteadyLoad:
        self._channel = grpc.aio.insecure_channel(self.target)
        await asyncio.wait_for(self._channel.channel_ready(), 10)
        stub = rls_pb2_grpc.RateLimitServiceStub(self._channel)
        for stream in self.streams:
            for n in range(stream.workers):
                self._tasks.append(asyncio.create_task(self._worker(stub, stream, n)))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop.set()
        try:
            await asyncio.gather(*self._tasks)
        finally:
            assert self._channel is not None
            await self._channel.close()

    def since(self, t: float, stream: str | None = None) -> list[Answer]:
        """Answers to calls made at or after wall-clock time ``t``."""
        return [
            a
            for a in list(self.answers)
            if a.started >= t and (stream is None or a.stream == stream)
        ]

    async def _worker(self, stub: rls_pb2_grpc.RateLimitServiceStub, stream: Stream, n: int):
        interval_s = stream.workers / stream.rate_per_s
        # Workers start spread over one interval, so calls arrive evenly, not in bursts.
        next_at = time.monotonic() + interval_s * n / stream.workers
        i = n
        while not self._stop.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at = max(next_at + interval_s, time.monotonic())
            if stream.gated:
                fraction = time.time() % 1.0
                if not GATE[0] <= fraction < GATE[1]:
                    continue
            value = stream.values[i % len(stream.values)]
            i += stream.workers
            self.answers.append(await self._call(stub, stream, value))

    async def _call(
        self, stub: rls_pb2_grpc.RateLimitServiceStub, stream: Stream, value: str
    ) -> Answer:
        entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=stream.key, value=value)
        message = rls_pb2.RateLimitRequest(
            domain=self.domain, descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
        )
        started, clock = time.time(), time.monotonic()
        try:
            response = await stub.ShouldRateLimit(message, timeout=self.deadline_s)
        except grpc.aio.AioRpcError as exc:
            return Answer(
                stream.name,
                value,
                started,
                time.time(),
                time.monotonic() - clock,
                exc.code().name,
                False,
                0,
                0.0,
                exc.details() or "",
            )
        [status] = response.statuses
        reset = status.duration_until_reset
        return Answer(
            stream.name,
            value,
            started,
            time.time(),
            time.monotonic() - clock,
            rls_pb2.RateLimitResponse.Code.Name(response.overall_code),
            status.HasField("current_limit"),
            status.limit_remaining,
            reset.seconds + reset.nanos / 1e9,
            "",
        )


def kinds(answers: Iterable[Answer]) -> dict[str, int]:
    """How many answers of each kind; an OK the failure mode gave is ``OK (no limit)``."""
    counted = Counter(
        "OK (no limit)" if a.kind == "OK" and not a.has_limit else a.kind for a in answers
    )
    return dict(sorted(counted.items()))


def window_counts(
    answers: Iterable[Answer], first: float, last: float
) -> dict[int, tuple[int, int]]:
    """Admitted answers per whole one-second window ``[w, w + 1)`` with ``first <= w`` and
    ``w + 1 <= last``, as ``(surely, at most)``: those made and answered inside the window,
    and those plus the ones whose call straddled one of its ends (decided on either side).
    With a gated stream the two agree unless an answer took longer than the gap."""
    windows = range(math.ceil(first), math.floor(last))
    surely = dict.fromkeys(windows, 0)
    straddling = dict.fromkeys(windows, 0)
    for a in answers:
        if a.kind != "OK":
            continue
        w = math.floor(a.started)
        if math.floor(a.ended) == w:
            if w in surely:
                surely[w] += 1
            continue
        for v in range(w, math.floor(a.ended) + 1):
            if v in straddling:
                straddling[v] += 1
    return {w: (surely[w], surely[w] + straddling[w]) for w in windows}
