"""sluice.lease.v1.LeaseService (Acquire, Renew, Release) on both gRPC transports: protobuf
in, ``sluice.leases.LeaseService`` call, protobuf out; nothing else happens here.

Refusals are ``GrpcError``s with the status ``sluice.errors.status_of`` gives (a bad field:
INVALID_ARGUMENT naming it; an unknown domain or a descriptor no concurrency rule matches:
NOT_FOUND; Redis unreachable: UNAVAILABLE). The ASGI edge answers them as they are;
``add_lease_service`` wraps each method for grpc.aio, which aborts the call with them.
Bytes that are not the request message are refused by name, never left to the transport.
On shutdown, ``drain()`` refuses new calls with UNAVAILABLE (retried elsewhere, as
ShouldRateLimit's) while the calls in flight finish before the lease store closes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from sluice._proto.sluice.lease.v1 import lease_pb2
from sluice.edge import GrpcApp
from sluice.edge.asgi import UNARY_UNARY
from sluice.edge.status import GrpcError, Status
from sluice.errors import InvalidRequestError, SluiceError, status_of
from sluice.grpc.core import DRAINING_MESSAGE, Draining, UndecodableRequest, protobuf_decoder
from sluice.leases.service import Entries, LeaseService
from sluice.metrics import Metrics

__all__ = ["LEASE_SERVICE_NAME", "LeaseCore", "add_lease_service", "add_lease_methods"]

log = logging.getLogger("sluice.grpc.leases")

LEASE_SERVICE_NAME = lease_pb2.DESCRIPTOR.services_by_name["LeaseService"].full_name
_MAX_UINT32 = 2**32 - 1


def _entries(request: Any) -> Entries:
    return tuple((entry.key, entry.value) for entry in request.entries)


def _ms(seconds: float) -> int:
    """Whole milliseconds, rounded up (a client told to wait is never early), as a uint32."""
    return min(_MAX_UINT32, math.ceil(seconds * 1000))


class LeaseCore(Draining):
    def __init__(self, service: LeaseService, metrics: Metrics | None = None) -> None:
        super().__init__()
        self.service = service
        self._metrics = metrics

    def _count(self, method: str, result: str) -> None:
        if self._metrics is not None:
            self._metrics.count_lease_call(method, result)

    async def _answer(
        self, method: str, request: Any, call: Callable[[Any], Awaitable[Any]]
    ) -> Any:
        if self._draining:
            self._count(method, Status.UNAVAILABLE.name.lower())
            raise GrpcError(Status.UNAVAILABLE, DRAINING_MESSAGE)
        self._in_flight += 1
        try:
            if isinstance(request, UndecodableRequest):
                raise InvalidRequestError(request.reason)
            return await call(request)
        except SluiceError as exc:
            status = status_of(exc)
            if status is None:
                log.exception("LeaseService failed")
                self._count(method, Status.INTERNAL.name.lower())
                raise GrpcError(Status.INTERNAL, "internal error") from None
            self._count(method, status.grpc.lower())
            raise GrpcError(Status[status.grpc], str(exc)) from None
        finally:
            self._in_flight -= 1
            if self._draining and self._in_flight == 0:
                self._idle.set()

    async def acquire(self, request: Any, context: object = None) -> lease_pb2.AcquireResponse:
        grant = await self._answer(
            "acquire",
            request,
            lambda r: self.service.acquire(r.domain, _entries(r), ttl_s=r.ttl_ms / 1000),
        )
        self._count("acquire", "granted" if grant.granted else "refused")
        return lease_pb2.AcquireResponse(
            granted=grant.granted,
            lease_id=grant.lease_id,
            ttl_ms=_ms(grant.ttl_s),
            max_leases=grant.max_leases,
            in_flight=grant.in_flight,
            retry_after_ms=_ms(grant.retry_after_s),
            reason=grant.reason,
        )

    async def renew(self, request: Any, context: object = None) -> lease_pb2.RenewResponse:
        renewal = await self._answer(
            "renew",
            request,
            lambda r: self.service.renew(r.domain, _entries(r), r.lease_id, ttl_s=r.ttl_ms / 1000),
        )
        self._count("renew", "renewed" if renewal.renewed else "expired")
        return lease_pb2.RenewResponse(renewed=renewal.renewed, ttl_ms=_ms(renewal.ttl_s))

    async def release(self, request: Any, context: object = None) -> lease_pb2.ReleaseResponse:
        released = await self._answer(
            "release", request, lambda r: self.service.release(r.domain, _entries(r), r.lease_id)
        )
        self._count("release", "released" if released else "unknown")
        return lease_pb2.ReleaseResponse(released=released)

    def methods(self) -> dict[str, tuple[Callable[..., Awaitable[Any]], Callable[[bytes], Any]]]:
        """Each method's name, handler and request decoder."""
        return {
            "Acquire": (self.acquire, protobuf_decoder(lease_pb2.AcquireRequest)),
            "Renew": (self.renew, protobuf_decoder(lease_pb2.RenewRequest)),
            "Release": (self.release, protobuf_decoder(lease_pb2.ReleaseRequest)),
        }


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def add_lease_methods(app: GrpcApp, core: LeaseCore) -> None:
    """The LeaseService on the ASGI edge (the default transport, inside Envoy)."""
    for name, (handler, decode) in core.methods().items():
        app.add_method(f"/{LEASE_SERVICE_NAME}/{name}", UNARY_UNARY, handler, decode, _serialize)


def add_lease_service(server: grpc.aio.Server, core: LeaseCore) -> None:
    """The LeaseService on grpc.aio (``--transport grpcio``)."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            _aborting(handler), request_deserializer=decode, response_serializer=_serialize
        )
        for name, (handler, decode) in core.methods().items()
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(LEASE_SERVICE_NAME, handlers),)
    )


def _aborting(
    handler: Callable[..., Awaitable[Any]],
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await handler(request)
        except GrpcError as refusal:
            await context.abort(grpc.StatusCode[refusal.status.name], refusal.message)
            raise  # not reached: abort raises

    return call
