"""grpc.health.v1.Health (Check, Watch) on a ``GrpcApp``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

from grpc_health.v1 import health_pb2
from grpc_health.v1.health_pb2 import HealthCheckResponse as _Response

from sluice.edge.asgi import UNARY_STREAM, UNARY_UNARY, Context, GrpcApp
from sluice.edge.status import GrpcError, Status

__all__ = ["HealthService"]

SERVICE_NAME = "grpc.health.v1.Health"


class HealthService:
    """Serving status per service name; Check answers NOT_FOUND for a name never set, Watch
    sends SERVICE_UNKNOWN for it and every change after."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._status: dict[str, int] = {name: _Response.NOT_SERVING for name in names}
        self._changed = asyncio.Condition()

    async def set(self, name: str, status: int) -> None:
        async with self._changed:
            self._status[name] = status
            self._changed.notify_all()

    async def set_all(self, status: int) -> None:
        async with self._changed:
            for name in self._status:
                self._status[name] = status
            self._changed.notify_all()

    def add_to(self, app: GrpcApp) -> None:
        prefix = f"/{SERVICE_NAME}/"
        decode = health_pb2.HealthCheckRequest.FromString
        encode = _Response.SerializeToString
        app.add_method(prefix + "Check", UNARY_UNARY, self.check, decode, encode)
        app.add_method(prefix + "Watch", UNARY_STREAM, self.watch, decode, encode)

    async def check(self, request: health_pb2.HealthCheckRequest, context: Context) -> _Response:
        status = self._status.get(request.service)
        if status is None:
            raise GrpcError(Status.NOT_FOUND, f"unknown service {request.service!r}")
        return _Response(status=status)

    async def watch(
        self, request: health_pb2.HealthCheckRequest, context: Context
    ) -> AsyncIterator[_Response]:
        last = None
        while True:
            async with self._changed:
                status = self._status.get(request.service, _Response.SERVICE_UNKNOWN)
                if status == last:
                    await self._changed.wait()
                    continue
            last = status
            yield _Response(status=status)
