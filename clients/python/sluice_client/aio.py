"""AsyncClient: Client's API over grpc.aio, for asyncio applications (the ASGI middleware
and the gRPC interceptor use it). Only I/O lives here, as in client.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from sluice_client import _lease, _wire
from sluice_client._acquire import next_step
from sluice_client._channel import ChannelConfig, PemSource, channel_config
from sluice_client._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice_client._proto.sluice.lease.v1 import lease_pb2_grpc
from sluice_client.lease import AsyncLease
from sluice_client.quota import DEFAULT_REPORT_INTERVAL_S, AsyncQuota
from sluice_client.types import Decision, DescriptorLike, OnUnavailable

__all__ = ["AsyncClient"]


class AsyncClient:
    """An asyncio Sluice client; the same arguments and behaviour as ``Client``.

    The channel is opened on first use, inside the running event loop: an AsyncClient may be
    built at import time (as ASGI apps usually are) before any loop exists. Use it from one
    event loop only.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = _wire.DEFAULT_TIMEOUT_S,
        on_unavailable: OnUnavailable = "allow",
        tls: bool = False,
        root_certificates: PemSource | None = None,
        certificate_chain: PemSource | None = None,
        private_key: PemSource | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self._timeout_s = _wire.check_timeout(timeout_s)
        self._on_unavailable = _wire.check_on_unavailable(on_unavailable)
        self._metadata = tuple(metadata)
        self._config: ChannelConfig = channel_config(
            target,
            credentials=credentials,
            tls=tls,
            root_certificates=root_certificates,
            certificate_chain=certificate_chain,
            private_key=private_key,
            options=options,
        )
        self._channel: grpc.aio.Channel | None = None
        self._stub: rls_pb2_grpc.RateLimitServiceStub | None = None
        self._lease_stub: lease_pb2_grpc.LeaseServiceStub | None = None
        self._quotas: dict[str, AsyncQuota] = {}

    def _get_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            config = self._config
            if config.credentials is None:
                self._channel = grpc.aio.insecure_channel(config.target, options=config.options)
            else:
                self._channel = grpc.aio.secure_channel(
                    config.target, config.credentials, options=config.options
                )
        return self._channel

    def _get_stub(self) -> rls_pb2_grpc.RateLimitServiceStub:
        if self._stub is None:
            self._stub = rls_pb2_grpc.RateLimitServiceStub(self._get_channel())
        return self._stub

    def _get_lease_stub(self) -> lease_pb2_grpc.LeaseServiceStub:
        if self._lease_stub is None:
            self._lease_stub = lease_pb2_grpc.LeaseServiceStub(self._get_channel())
        return self._lease_stub

    async def check(
        self,
        domain: str,
        descriptors: Sequence[DescriptorLike],
        *,
        hits: int = 1,
        timeout_s: float | None = None,
    ) -> Decision:
        """As ``Client.check``: a call refused with UNAVAILABLE is asked again, once."""
        request = _wire.build_request(domain, descriptors, hits=hits)
        timeout = self._timeout_s if timeout_s is None else _wire.check_timeout(timeout_s)
        stub = self._get_stub()
        started = time.monotonic()
        try:
            response = await stub.ShouldRateLimit(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            retry_s = _wire.retry_timeout_s(exc, left_s=timeout - (time.monotonic() - started))
            if retry_s is None:
                return self._failed(exc, request)
            try:
                response = await stub.ShouldRateLimit(
                    request, timeout=retry_s, metadata=self._metadata
                )
            except grpc.RpcError as again:
                return self._failed(again, request)
        return _wire.parse_response(response)

    async def acquire(
        self,
        domain: str,
        descriptors: Sequence[DescriptorLike],
        *,
        max_wait_s: float,
        hits: int = 1,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> Decision:
        """As ``Client.acquire``, waiting with ``await sleep(...)``."""
        deadline = clock() + max_wait_s
        while True:
            decision = await self.check(domain, descriptors, hits=hits, timeout_s=timeout_s)
            step = next_step(decision, budget_s=deadline - clock(), max_wait_s=max_wait_s)
            if step.wait_s > 0:
                await sleep(step.wait_s)
            if step.done:
                return decision

    def lease(
        self,
        domain: str,
        entries: _lease.Entries,
        *,
        ttl_s: float | None = None,
        timeout_s: float | None = None,
    ) -> AsyncLease:
        """As ``Client.lease``: ``lease = await client.lease(...)``, or ``async with
        client.lease(...) as lease:``; renewed by a task on the running event loop."""
        target = _lease.build_target(domain, entries, ttl_s)
        timeout = self._timeout_s if timeout_s is None else _wire.check_timeout(timeout_s)
        return AsyncLease(
            self._get_lease_stub,
            target,
            timeout_s=timeout,
            on_unavailable=self._on_unavailable,
            metadata=self._metadata,
        )

    def quota(
        self, domain: str, *, report_interval_s: float = DEFAULT_REPORT_INTERVAL_S
    ) -> AsyncQuota:
        """As ``Client.quota``; the stream starts as a task of the running event loop on the
        first ``allow()`` (or ``async with``), so this may be called before any loop runs."""
        quota = self._quotas.get(domain)
        if quota is not None:
            if quota.report_interval_s != report_interval_s:
                raise ValueError(
                    f"report_interval_s: the open quota for domain {domain!r} reports "
                    f"every {quota.report_interval_s}s, not {report_interval_s}s"
                )
            return quota
        quota = AsyncQuota(
            self._get_channel,
            domain,
            report_interval_s=report_interval_s,
            on_unavailable=self._on_unavailable,
            metadata=self._metadata,
            on_close=self._forget_quota,
        )
        self._quotas[domain] = quota
        return quota

    def _forget_quota(self, quota: AsyncQuota) -> None:
        if self._quotas.get(quota.domain) is quota:
            del self._quotas[quota.domain]

    def _failed(self, error: grpc.RpcError, request: rls_pb2.RateLimitRequest) -> Decision:
        return _wire.decision_from_error(
            error, descriptor_count=len(request.descriptors), on_unavailable=self._on_unavailable
        )

    async def close(self) -> None:
        """Close the quotas' streams, then the channel."""
        for quota in list(self._quotas.values()):
            await quota.close()
        if self._channel is not None:
            await self._channel.close(grace=None)
        self._channel = self._stub = self._lease_stub = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
