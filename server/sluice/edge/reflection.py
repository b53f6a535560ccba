"""gRPC server reflection (v1alpha, and v1, whose messages are the same on the wire) on a
``GrpcApp``: the request handling is grpcio-reflection's own, minus grpc.aio."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from sluice.edge.asgi import STREAM_STREAM, GrpcApp

__all__ = ["SERVICE_NAMES", "add_reflection"]

SERVICE_NAMES = ("grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection")


def add_reflection(app: GrpcApp, service_names: Iterable[str]) -> None:
    """Describe ``service_names`` (and reflection itself) from the default descriptor pool."""
    # Listed as grpc.aio lists them: v1alpha, the name in the default descriptor pool.
    servicer = ReflectionServicer((*service_names, SERVICE_NAMES[0]))

    async def info(requests: Any, context: Any) -> AsyncIterator[Any]:
        async for response in servicer.ServerReflectionInfo(requests, context):
            yield response

    for name in SERVICE_NAMES:
        app.add_method(
            f"/{name}/ServerReflectionInfo",
            STREAM_STREAM,
            info,
            reflection_pb2.ServerReflectionRequest.FromString,
            reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
