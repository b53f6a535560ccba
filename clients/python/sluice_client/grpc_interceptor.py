"""RateLimitInterceptor: Sluice in front of a Python grpc.aio server, plus the descriptor
sources that read a call's method and metadata.

The check runs before the handler; a refused call ends with RESOURCE_EXHAUSTED and trailing
metadata ``retry-after`` (whole seconds), ``ratelimit`` and ``ratelimit-policy`` (UNAVAILABLE
when the refusal is the client's ``on_unavailable="deny"`` choice rather than a limit).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from sluice_client.aio import AsyncClient
from sluice_client.headers import rate_limit_headers
from sluice_client.sources import Source, constant, each, nested
from sluice_client.types import Decision, DescriptorLike

__all__ = ["RateLimitInterceptor", "constant", "each", "full_method", "metadata", "nested"]

CallDescriptors = Callable[
    [grpc.HandlerCallDetails], Sequence[DescriptorLike] | Awaitable[Sequence[DescriptorLike]]
]


# grpc-stubs makes ServerInterceptor generic; grpcio's class is not subscriptable at run time.
class RateLimitInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """``descriptors(handler_call_details)`` returns what to check ([] skips the check), e.g.
    ``nested(full_method(), metadata("x-tenant", key="tenant"))``."""

    def __init__(
        self,
        *,
        client: AsyncClient,
        domain: str,
        descriptors: CallDescriptors,
        hits: int = 1,
    ) -> None:
        self._client = client
        self._domain = domain
        self._descriptors = descriptors
        self._hits = hits

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED
            return handler
        produced = self._descriptors(handler_call_details)
        if inspect.isawaitable(produced):
            produced = await produced
        if not produced:
            return handler
        decision = await self._client.check(self._domain, produced, hits=self._hits)
        if not decision.allowed:
            return _refusing(handler, decision)
        if decision.delay_s > 0:
            await asyncio.sleep(decision.delay_s)
        return handler


def _refusing(
    handler: grpc.RpcMethodHandler[Any, Any], decision: Decision
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as ``handler`` that only aborts the call."""
    if decision.degraded:
        code, details = grpc.StatusCode.UNAVAILABLE, "rate limit service unavailable"
    else:
        code, details = grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limited"
    trailers = tuple((k.lower(), v) for k, v in rate_limit_headers(decision))

    async def abort(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, details, trailing_metadata=trailers)

    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return factory(
        abort,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


# Descriptor sources reading a call's HandlerCallDetails. Combine them with each() and nested().


def full_method(*, key: str = "grpc_method") -> Source[grpc.HandlerCallDetails]:
    """The full method name, ``/package.Service/Method``."""
    return lambda details: [{key: details.method}]


def metadata(name: str, *, key: str | None = None) -> Source[grpc.HandlerCallDetails]:
    """An invocation metadata value (first one) under ``key`` (default: its name)."""
    wanted = name.lower()
    entry_key = key or wanted

    def build(details: grpc.HandlerCallDetails) -> list[dict[str, str]]:
        for item_key, value in details.invocation_metadata or ():
            if item_key.lower() == wanted and isinstance(value, str):
                return [{entry_key: value}]
        return []

    return build
