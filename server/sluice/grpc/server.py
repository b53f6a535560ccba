"""The grpc.aio server: ShouldRateLimit, StreamRateLimitQuotas (RLQS), grpc.health.v1 and
server reflection on one port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sluice._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2
from sluice.edge.status import GrpcError
from sluice.grpc.codec import encode_decision
from sluice.grpc.core import RateLimitCore, decode_request
from sluice.grpc.servicer import RateLimitServicer
from sluice.limiter import RateLimiter
from sluice.metrics import Metrics
from sluice.rlqs.service import QuotaService
from sluice.rlqs.wire import decode_reports

__all__ = ["GrpcServer", "HEALTH_SERVICE_NAMES"]

_RLS_NAME = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"].full_name
RLQS_NAME = rlqs_pb2.DESCRIPTOR.services_by_name["RateLimitQuotaService"].full_name
# "" is the whole server; "ratelimit" is what envoyproxy/ratelimit's health checks ask for;
# the service's full name is what Envoy's and Kubernetes' gRPC health checks name.
HEALTH_SERVICE_NAMES = ("", "ratelimit", _RLS_NAME)


class GrpcServer:
    def __init__(
        self,
        limiter: RateLimiter,
        host: str,
        port: int,
        *,
        metrics: Metrics | None = None,
        credentials: grpc.ServerCredentials | None = None,
        reuse_port: bool = False,
        core: RateLimitCore | None = None,
        quota: QuotaService | None = None,
        max_connection_age_s: float = 0,
        max_connection_age_grace_s: float = 0,
    ) -> None:
        """``reuse_port``: share the port with other processes that set it too (workers);
        otherwise binding a port another server holds fails. ``max_connection_age_s``: send
        GOAWAY to a connection this old (0: never), so long-lived clients such as Envoy
        reconnect and spread over new instances; ``max_connection_age_grace_s``: then close
        it after this long even with calls in flight (0: wait for them)."""
        options: list[tuple[str, int]] = [
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            ("grpc.max_receive_message_length", 4 * 1024 * 1024),
        ]
        if max_connection_age_s > 0:
            options.append(("grpc.max_connection_age_ms", round(max_connection_age_s * 1000)))
        if max_connection_age_grace_s > 0:
            grace_ms = round(max_connection_age_grace_s * 1000)
            options.append(("grpc.max_connection_age_grace_ms", grace_ms))
        self._server = grpc.aio.server(options=options)
        self.servicer = RateLimitServicer(limiter, metrics, core=core)  # drain() on shutdown
        _add_rate_limit_service(self.servicer, self._server)
        services = [_RLS_NAME]
        if quota is not None:
            _add_quota_service(quota, self._server)
            services.append(RLQS_NAME)
        # grpc-stubs (1.53) predates grpc_health's aio module and registered handlers.
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (*services, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        address = f"{host}:{port}"
        if credentials is None:
            self.port = self._server.add_insecure_port(address)
        else:
            self.port = self._server.add_secure_port(address, credentials)
        if self.port == 0:
            raise OSError(f"cannot bind the gRPC port {host}:{port}")

    async def start(self) -> None:
        await self._server.start()
        await self.set_serving(True)

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in HEALTH_SERVICE_NAMES:
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        """Report NOT_SERVING, refuse new calls, and let in-flight calls finish within grace_s."""
        await self.set_serving(False)
        await self._server.stop(grace_s)

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


def _add_rate_limit_service(servicer: RateLimitServicer, server: grpc.aio.Server) -> None:
    """What the generated add_RateLimitServiceServicer_to_server does, with a deserializer
    that never raises, so undecodable bytes reach the servicer to be refused by name."""
    handlers = {
        "ShouldRateLimit": grpc.unary_unary_rpc_method_handler(
            servicer.ShouldRateLimit,
            request_deserializer=decode_request,
            response_serializer=encode_decision,
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_RLS_NAME, handlers),))
    # Registered handlers are looked up without the generic handlers' string matching.
    server.add_registered_method_handlers(_RLS_NAME, handlers)  # type: ignore[attr-defined]


def _add_quota_service(quota: QuotaService, server: grpc.aio.Server) -> None:
    """StreamRateLimitQuotas on grpc.aio: the service's ``GrpcError`` becomes the call's
    status."""

    async def stream(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        try:
            async for response in quota.stream(requests):
                yield response
        except GrpcError as refusal:
            await context.abort(grpc.StatusCode[refusal.status.name], refusal.message)

    handlers = {
        "StreamRateLimitQuotas": grpc.stream_stream_rpc_method_handler(
            stream,
            request_deserializer=decode_reports,
            response_serializer=bytes,  # the service encodes its responses itself
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RLQS_NAME, handlers),))
