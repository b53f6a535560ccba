"""Quota and AsyncQuota: limits decided in process, from assignments Sluice streams over
Envoy's Rate Limit Quota Service (``StreamRateLimitQuotas``), with no call per decision.

Each holds one stream for one domain, opened by ``Client.quota(domain)`` (a thread runs it) or
``AsyncClient.quota(domain)`` (an asyncio task). Only I/O lives here: what to report, how an
assignment decides, and what a lost stream means come from the pure ``_quota``,
``_quota_wire`` and ``_token_bucket``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from types import TracebackType

import grpc
import grpc.aio

from sluice_client._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from sluice_client._quota import QuotaState, check_cost, reconnect_delay_s
from sluice_client._quota_wire import build_reports, parse_actions
from sluice_client.errors import InvalidRequest, SluiceUnavailable
from sluice_client.types import OnUnavailable, QuotaDecision

__all__ = ["AsyncQuota", "Quota"]

_log = logging.getLogger("sluice_client.quota")

DEFAULT_REPORT_INTERVAL_S = 5.0


def check_quota_args(domain: str, report_interval_s: float) -> float:
    if not isinstance(domain, str) or not domain:
        raise InvalidRequest("domain: must be a non-empty string")
    if (
        isinstance(report_interval_s, bool)
        or not isinstance(report_interval_s, int | float)
        or not 0.05 <= report_interval_s <= 3600
    ):
        raise ValueError(
            f"report_interval_s: must be a number from 0.05 to 3600, not {report_interval_s!r}"
        )
    return float(report_interval_s)


def _fallback(on_unavailable: OnUnavailable) -> bool | None:
    return None if on_unavailable == "raise" else on_unavailable == "allow"


def _unavailable(domain: str, bucket: Mapping[str, str]) -> SluiceUnavailable:
    return SluiceUnavailable(
        f"no live quota assignment for bucket {dict(bucket)!r} of domain {domain!r}"
    )


def _failure(error: BaseException) -> str:
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return f"{error.code().name}: {error.details()}"
    return repr(error)


class Quota:
    """Decides ``allow(bucket)`` in this process from the token bucket Sluice assigned to the
    bucket; a background thread holds the stream, reports usage every
    ``report_interval_s`` and reconnects (with backoff) when the stream fails. ``allow()`` is
    thread-safe and makes no network call.

    Built by ``Client.quota(domain)``; ``close()`` (or leaving a ``with`` block) ends the
    stream.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        domain: str,
        *,
        report_interval_s: float,
        on_unavailable: OnUnavailable,
        metadata: Sequence[tuple[str, str]] = (),
        on_close: Callable[[Quota], None] | None = None,
    ) -> None:
        self.domain = domain
        self.report_interval_s = check_quota_args(domain, report_interval_s)
        self._fallback = _fallback(on_unavailable)
        self._metadata = tuple(metadata)
        self._on_close = on_close
        self._stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel)
        self._state = QuotaState(report_interval_s=self.report_interval_s, now_s=time.monotonic())
        # Guards the state; the stream's request iterator waits on it for the next report.
        self._lock = threading.Condition()
        self._closed = threading.Event()
        self._stream: object | None = None  # the live stream's token; None while down
        self._call: grpc.Future[rlqs_pb2.RateLimitQuotaResponse] | None = None
        self._thread = threading.Thread(target=self._run, name=f"sluice-quota-{domain}")
        self._thread.daemon = True
        self._thread.start()

    def allow(self, bucket: Mapping[str, str], *, cost: int = 1) -> QuotaDecision:
        """Whether ``cost`` requests of ``bucket`` (e.g. ``{"tenant": "acme"}``) may go ahead
        now; counted either way in the next report. Without a live assignment the client's
        ``on_unavailable`` decides (``degraded=True``; ``"raise"``: SluiceUnavailable)."""
        check_cost(cost)
        with self._lock:
            decision, new = self._state.decide(
                bucket, cost, now_s=time.monotonic(), fallback=self._fallback
            )
            if new:
                self._lock.notify_all()
        if decision is None:
            raise _unavailable(self.domain, bucket)
        return decision

    def _run(self) -> None:
        failures = 0
        while not self._closed.is_set():
            token = object()
            with self._lock:
                self._state.stream_started()
                self._stream = token
            # wait_for_ready: while Sluice is unreachable the call waits for the channel's
            # own reconnection (backoff capped at 5 s, _channel.py) instead of failing at once
            # and adding this loop's backoff on top of it.
            call = self._stub.StreamRateLimitQuotas(
                self._requests(token), metadata=self._metadata, wait_for_ready=True
            )
            self._call = call
            if self._closed.is_set():
                call.cancel()
            try:
                for response in call:
                    actions = parse_actions(response)
                    with self._lock:
                        self._state.apply(actions, now_s=time.monotonic())
                    failures = 0
                ended = "the server ended the stream"
            except grpc.RpcError as exc:
                ended = _failure(exc)
            finally:
                with self._lock:
                    self._stream = None
                    self._state.stream_lost()
                    self._lock.notify_all()
            if self._closed.is_set():
                return
            delay = reconnect_delay_s(failures, jitter=random.random())
            failures += 1
            _log.log(
                logging.WARNING if failures == 1 else logging.DEBUG,
                "RLQS stream for %r lost (%s); reconnecting in %.2fs",
                self.domain,
                ended,
                delay,
            )
            self._closed.wait(delay)

    def _requests(self, token: object) -> Iterator[rlqs_pb2.RateLimitQuotaUsageReports]:
        # grpc consumes this in its own thread; it ends (half-closing the stream) when the
        # stream it belongs to is over or the quota closes.
        while True:
            with self._lock:
                while True:
                    if self._closed.is_set() or self._stream is not token:
                        return
                    wait_s = self._state.due_in_s(time.monotonic())
                    if wait_s <= 0:
                        break
                    self._lock.wait(wait_s)
                usages = self._state.take_report(time.monotonic())
            if usages:
                yield build_reports(self.domain, usages)

    def close(self) -> None:
        """End the stream and the thread; later ``allow()`` calls fall back."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            self._state.drop_assignments()
            self._lock.notify_all()
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._on_close is not None:
            self._on_close(self)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> Quota:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncQuota:
    """``Quota`` for asyncio: the stream runs as a task of the event loop ``allow()`` is first
    called from (or the ``async with`` block's). ``allow()`` itself stays synchronous: it
    makes no network call, so there is nothing to await. Built by ``AsyncClient.quota``."""

    def __init__(
        self,
        channel: Callable[[], grpc.aio.Channel],
        domain: str,
        *,
        report_interval_s: float,
        on_unavailable: OnUnavailable,
        metadata: Sequence[tuple[str, str]] = (),
        on_close: Callable[[AsyncQuota], None] | None = None,
    ) -> None:
        self.domain = domain
        self.report_interval_s = check_quota_args(domain, report_interval_s)
        self._fallback = _fallback(on_unavailable)
        self._metadata = tuple(metadata)
        self._on_close = on_close
        self._channel = channel
        self._state = QuotaState(report_interval_s=self.report_interval_s, now_s=time.monotonic())
        # allow() may be called from another thread than the loop's; the lock keeps the
        # state whole, and wake() reaches the loop through call_soon_threadsafe.
        self._lock = threading.Lock()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._stream: object | None = None
        self._call: (
            grpc.aio.StreamStreamCall[
                rlqs_pb2.RateLimitQuotaUsageReports, rlqs_pb2.RateLimitQuotaResponse
            ]
            | None
        ) = None
        self._stopped: asyncio.Event | None = None

    def _start(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "AsyncQuota: the first allow() must be called inside the running event loop "
                "(it starts the stream there); from threads, use Client.quota"
            ) from None
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name=f"sluice-quota-{self.domain}")

    def allow(self, bucket: Mapping[str, str], *, cost: int = 1) -> QuotaDecision:
        """As ``Quota.allow``. The first call (from inside the event loop) starts the
        stream."""
        check_cost(cost)
        if self._task is None and not self._closed:
            self._start()
        with self._lock:
            decision, new = self._state.decide(
                bucket, cost, now_s=time.monotonic(), fallback=self._fallback
            )
        if new and self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        if decision is None:
            raise _unavailable(self.domain, bucket)
        return decision

    async def _run(self) -> None:
        assert self._stopped is not None
        failures = 0
        stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(self._channel())
        while not self._closed:
            token = object()
            with self._lock:
                self._state.stream_started()
            self._stream = token
            call = stub.StreamRateLimitQuotas(
                self._requests(token), metadata=self._metadata, wait_for_ready=True
            )
            self._call = call
            try:
                async for response in call:
                    actions = parse_actions(response)
                    with self._lock:
                        self._state.apply(actions, now_s=time.monotonic())
                    failures = 0
                ended = "the server ended the stream"
            except grpc.RpcError as exc:
                ended = _failure(exc)
            except asyncio.CancelledError:
                # close() cancels the call, and grpc.aio raises CancelledError for that; a
                # cancellation of this task itself (the loop shutting down) goes on up.
                task = asyncio.current_task()
                if not self._closed or (task is not None and task.cancelling()):
                    raise
                ended = "closed"
            finally:
                self._stream = None
                with self._lock:
                    self._state.stream_lost()
                self._wake_up()
            if self._closed:
                return
            delay = reconnect_delay_s(failures, jitter=random.random())
            failures += 1
            _log.log(
                logging.WARNING if failures == 1 else logging.DEBUG,
                "RLQS stream for %r lost (%s); reconnecting in %.2fs",
                self.domain,
                ended,
                delay,
            )
            try:
                await asyncio.wait_for(self._stopped.wait(), delay)
            except TimeoutError:
                pass

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _requests(self, token: object) -> AsyncIterator[rlqs_pb2.RateLimitQuotaUsageReports]:
        assert self._wake is not None
        while True:
            while True:
                if self._closed or self._stream is not token:
                    return
                # Cleared before reading the state: a new bucket's wake-up (run on this loop)
                # then lands either in the state read or in the wait, never in between.
                self._wake.clear()
                with self._lock:
                    wait_s = self._state.due_in_s(time.monotonic())
                if wait_s <= 0:
                    break
                try:
                    await asyncio.wait_for(self._wake.wait(), wait_s)
                except TimeoutError:
                    pass
            with self._lock:
                usages = self._state.take_report(time.monotonic())
            if usages:
                yield build_reports(self.domain, usages)

    async def close(self) -> None:
        """End the stream and its task; later ``allow()`` calls fall back."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._state.drop_assignments()
        if self._task is not None:
            assert self._stopped is not None
            self._stopped.set()
            self._wake_up()
            if self._call is not None:
                self._call.cancel()
            await self._task
        if self._on_close is not None:
            self._on_close(self)

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> AsyncQuota:
        if self._task is None and not self._closed:
            self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
