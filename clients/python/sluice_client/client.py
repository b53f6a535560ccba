"""Client: the blocking client. Only I/O lives here; requests, responses, failure choices
and acquire()'s waiting policy come from the shared pure modules."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import grpc

from sluice_client import _lease, _wire
from sluice_client._acquire import next_step
from sluice_client._channel import PemSource, channel_config
from sluice_client._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice_client._proto.sluice.lease.v1 import lease_pb2_grpc
from sluice_client.lease import Lease
from sluice_client.quota import DEFAULT_REPORT_INTERVAL_S, Quota
from sluice_client.types import Decision, DescriptorLike, OnUnavailable

__all__ = ["Client"]


class Client:
    """A blocking Sluice client over one gRPC channel, reused by every call; thread-safe.

    ``on_unavailable`` decides what a call returns when Sluice cannot be asked (unreachable,
    past the deadline, failing): ``"allow"`` (an allowed Decision with ``degraded=True``, as
    Envoy's ``failure_mode_deny: false``), ``"deny"`` (a refused degraded one) or ``"raise"``
    (SluiceUnavailable). Transport: plaintext unless ``tls``, PEM ``root_certificates`` /
    ``certificate_chain`` + ``private_key`` (mTLS; bytes or a file path) or ready
    ``credentials`` are given.
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
        config = channel_config(
            target,
            credentials=credentials,
            tls=tls,
            root_certificates=root_certificates,
            certificate_chain=certificate_chain,
            private_key=private_key,
            options=options,
        )
        if config.credentials is None:
            self._channel = grpc.insecure_channel(config.target, options=config.options)
        else:
            self._channel = grpc.secure_channel(
                config.target, config.credentials, options=config.options
            )
        self._stub = rls_pb2_grpc.RateLimitServiceStub(self._channel)
        self._lease_stub = lease_pb2_grpc.LeaseServiceStub(self._channel)
        self._quotas: dict[str, Quota] = {}
        self._quotas_lock = threading.Lock()

    def check(
        self,
        domain: str,
        descriptors: Sequence[DescriptorLike],
        *,
        hits: int = 1,
        timeout_s: float | None = None,
    ) -> Decision:
        """Ask Sluice once (a call refused with UNAVAILABLE is asked again, once, of the next
        server, within the same timeout); ``hits`` are counted against every descriptor's
        limit."""
        request = _wire.build_request(domain, descriptors, hits=hits)
        timeout = self._timeout_s if timeout_s is None else _wire.check_timeout(timeout_s)
        started = time.monotonic()
        try:
            response = self._stub.ShouldRateLimit(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            retry_s = _wire.retry_timeout_s(exc, left_s=timeout - (time.monotonic() - started))
            if retry_s is None:
                return self._failed(exc, request)
            try:
                response = self._stub.ShouldRateLimit(
                    request, timeout=retry_s, metadata=self._metadata
                )
            except grpc.RpcError as again:
                return self._failed(again, request)
        return _wire.parse_response(response)

    def acquire(
        self,
        domain: str,
        descriptors: Sequence[DescriptorLike],
        *,
        max_wait_s: float,
        hits: int = 1,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Decision:
        """Check, and wait until the request may go ahead: a leaky bucket's delay, or a
        refusal's retry-after followed by another check, for at most ``max_wait_s`` in all.
        Returns the admitting decision; raises RateLimited (carrying the last decision)."""
        deadline = clock() + max_wait_s
        while True:
            decision = self.check(domain, descriptors, hits=hits, timeout_s=timeout_s)
            step = next_step(decision, budget_s=deadline - clock(), max_wait_s=max_wait_s)
            if step.wait_s > 0:
                sleep(step.wait_s)
            if step.done:
                return decision

    def lease(
        self,
        domain: str,
        entries: _lease.Entries,
        *,
        ttl_s: float | None = None,
        timeout_s: float | None = None,
    ) -> Lease:
        """Take a concurrency lease for one descriptor (``entries``: a mapping or (key,
        value) pairs) of a ``concurrency`` rule; ``lease.granted`` says whether Sluice gave
        it. A granted lease is renewed in the background until ``lease.release()`` (or the
        end of ``with client.lease(...) as lease:``). ``ttl_s``: how long it outlives a
        client that dies holding it; None for the rule's ``lease_ttl``, else at most that.
        A domain or descriptor with no concurrency rule raises InvalidRequest."""
        target = _lease.build_target(domain, entries, ttl_s)
        timeout = self._timeout_s if timeout_s is None else _wire.check_timeout(timeout_s)
        return Lease(
            self._lease_stub,
            target,
            timeout_s=timeout,
            on_unavailable=self._on_unavailable,
            metadata=self._metadata,
        )

    def quota(self, domain: str, *, report_interval_s: float = DEFAULT_REPORT_INTERVAL_S) -> Quota:
        """A limiter for ``domain`` that decides in process, from the token buckets Sluice
        assigns over one RLQS stream (opened now, run by a background thread): no call per
        decision. One stream per domain: asking again for an open domain returns the same
        Quota (with the same ``report_interval_s``). ``on_unavailable`` decides for a bucket
        without a live assignment."""
        with self._quotas_lock:
            quota = self._quotas.get(domain)
            if quota is not None:
                if quota.report_interval_s != report_interval_s:
                    raise ValueError(
                        f"report_interval_s: the open quota for domain {domain!r} reports "
                        f"every {quota.report_interval_s}s, not {report_interval_s}s"
                    )
                return quota
            quota = Quota(
                self._channel,
                domain,
                report_interval_s=report_interval_s,
                on_unavailable=self._on_unavailable,
                metadata=self._metadata,
                on_close=self._forget_quota,
            )
            self._quotas[domain] = quota
            return quota

    def _forget_quota(self, quota: Quota) -> None:
        with self._quotas_lock:
            if self._quotas.get(quota.domain) is quota:
                del self._quotas[quota.domain]

    def _failed(self, error: grpc.RpcError, request: rls_pb2.RateLimitRequest) -> Decision:
        return _wire.decision_from_error(
            error, descriptor_count=len(request.descriptors), on_unavailable=self._on_unavailable
        )

    def close(self) -> None:
        """Close the quotas' streams, then the channel."""
        with self._quotas_lock:
            quotas = list(self._quotas.values())
        for quota in quotas:
            quota.close()
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
