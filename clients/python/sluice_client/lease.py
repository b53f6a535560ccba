"""``Lease`` and ``AsyncLease``: one concurrency lease, renewed in the background while held.

Taken with ``Client.lease()`` / ``AsyncClient.lease()``. A granted lease is renewed three
times per TTL (a thread, or an asyncio task) until ``release()`` or the end of its ``with``
block; if Sluice answers that it is no longer held (it expired while renewals failed), the
renewing stops and ``held`` turns False. A lease the client could not ask Sluice for follows
the client's ``on_unavailable``: ``degraded`` is then True and nothing is renewed or released.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from sluice_client import _lease
from sluice_client._lease import LeaseTarget
from sluice_client._proto.sluice.lease.v1 import lease_pb2, lease_pb2_grpc
from sluice_client.types import OnUnavailable

__all__ = ["AsyncLease", "Lease"]


class _State:
    """What Sluice said of the lease; shared by both classes."""

    granted = False
    degraded = False
    lease_id = ""
    ttl_s = 0.0
    max_leases = 0
    in_flight = 0
    retry_after_s = 0.0
    reason = ""  # not granted though not full: "blocked" (an operator's block)
    renewals = 0  # successful renewals so far
    _released = False
    _lost = False

    def _granted(self, response: lease_pb2.AcquireResponse) -> None:
        self.granted = response.granted
        self.lease_id = response.lease_id
        self.ttl_s = response.ttl_ms / 1000
        self.max_leases = response.max_leases
        self.in_flight = response.in_flight
        self.retry_after_s = response.retry_after_ms / 1000
        self.reason = response.reason

    @property
    def held(self) -> bool:
        """Granted by Sluice, and neither released nor lost since."""
        return self.granted and not self.degraded and not self._released and not self._lost

    def __repr__(self) -> str:
        state = "held" if self.held else "granted" if self.granted else "refused"
        return f"<{type(self).__name__} {state} {self.lease_id or '-'} in_flight={self.in_flight}>"


class Lease(_State):
    """A lease taken by ``Client.lease()``; a context manager that releases it on exit."""

    def __init__(
        self,
        stub: lease_pb2_grpc.LeaseServiceStub,
        target: LeaseTarget,
        *,
        timeout_s: float,
        on_unavailable: OnUnavailable,
        metadata: tuple[tuple[str, str], ...],
    ) -> None:
        self._stub = stub
        self._target = target
        self._timeout_s = timeout_s
        self._metadata = metadata
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            response = stub.Acquire(target.acquire(), timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            self.granted = _lease.failed(exc, on_unavailable=on_unavailable)
            self.degraded = True
            return
        self._granted(response)
        if self.granted:
            self._thread = threading.Thread(
                target=self._renew_until_stopped, name="sluice-lease-renewal", daemon=True
            )
            self._thread.start()

    def _renew_until_stopped(self) -> None:
        interval = _lease.renew_interval_s(round(self.ttl_s * 1000))
        request = self._target.renew(self.lease_id)
        expires = time.monotonic() + self.ttl_s
        while not self._stop.wait(interval):
            try:
                response = self._stub.Renew(
                    request, timeout=self._timeout_s, metadata=self._metadata
                )
            except grpc.RpcError:
                if time.monotonic() >= expires:
                    self._lost = True  # no renewal got through within the TTL
                    return
                continue  # asked again next interval, while the lease may still be held
            except ValueError:  # the client was closed: the lease lapses by itself
                self._lost = True
                return
            if not response.renewed:
                self._lost = True
                return
            self.renewals += 1
            expires = time.monotonic() + response.ttl_ms / 1000

    def release(self) -> bool:
        """Stop renewing and give the lease back. True if Sluice released it; False if it
        was not held (never granted, released already, expired) or Sluice could not be asked
        (the lease then expires by itself)."""
        if not self.held:
            self._stop_renewing()
            return False
        self._released = True
        self._stop_renewing()
        try:
            response = self._stub.Release(
                self._target.release(self.lease_id),
                timeout=self._timeout_s,
                metadata=self._metadata,
            )
        except grpc.RpcError:
            return False
        return bool(response.released)

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class AsyncLease(_State):
    """A lease taken by ``AsyncClient.lease()``: ``await`` it, or ``async with`` it (which
    releases it on exit). Renewed by a task on the event loop that acquired it."""

    def __init__(
        self,
        stub: Callable[[], lease_pb2_grpc.LeaseServiceStub],
        target: LeaseTarget,
        *,
        timeout_s: float,
        on_unavailable: OnUnavailable,
        metadata: tuple[tuple[str, str], ...],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._get_stub = stub
        self._target = target
        self._timeout_s = timeout_s
        self._on_unavailable = on_unavailable
        self._metadata = metadata
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self._acquired = False

    async def _acquire(self) -> AsyncLease:
        if self._acquired:
            return self
        self._acquired = True
        try:
            response = await self._get_stub().Acquire(
                self._target.acquire(), timeout=self._timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            self.granted = _lease.failed(exc, on_unavailable=self._on_unavailable)
            self.degraded = True
            return self
        self._granted(response)
        if self.granted:
            self._task = asyncio.get_running_loop().create_task(self._renew_until_stopped())
        return self

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        return self._acquire().__await__()

    async def _renew_until_stopped(self) -> None:
        interval = _lease.renew_interval_s(round(self.ttl_s * 1000))
        request = self._target.renew(self.lease_id)
        loop = asyncio.get_running_loop()
        expires = loop.time() + self.ttl_s
        while True:
            await self._sleep(interval)
            try:
                response = await self._get_stub().Renew(
                    request, timeout=self._timeout_s, metadata=self._metadata
                )
            except grpc.RpcError:
                if loop.time() >= expires:
                    self._lost = True
                    return
                continue
            except grpc.aio.UsageError:  # the client was closed: the lease lapses by itself
                self._lost = True
                return
            if not response.renewed:
                self._lost = True
                return
            self.renewals += 1
            expires = loop.time() + response.ttl_ms / 1000

    async def release(self) -> bool:
        """As ``Lease.release``."""
        held = self.held
        self._released = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if not held:
            return False
        try:
            response = await self._get_stub().Release(
                self._target.release(self.lease_id),
                timeout=self._timeout_s,
                metadata=self._metadata,
            )
        except grpc.RpcError:
            return False
        return bool(response.released)

    async def __aenter__(self) -> AsyncLease:
        return await self._acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()
