"""RateLimitService/ShouldRateLimit on grpc.aio: the transport-neutral ``RateLimitCore``
(grpc/core.py) behind grpc.aio's servicer interface.

Draining (``drain()``, on shutdown): new calls are refused with UNAVAILABLE, which a client
may safely retry on another instance (the call changed nothing here), while the calls already
deciding finish. gRPC's own server shutdown is no substitute: calls that reach it while it runs
are cancelled, and CANCELLED is a status clients do not retry.
"""

from __future__ import annotations

from typing import Any

import grpc

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2_grpc
from sluice.edge.status import GrpcError
from sluice.grpc.core import RateLimitCore, UndecodableRequest
from sluice.limiter import RateLimiter
from sluice.metrics import Metrics
from sluice.model import Decision, RateLimitRequest

__all__ = ["RateLimitServicer"]


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):
    def __init__(
        self,
        limiter: RateLimiter,
        metrics: Metrics | None = None,
        *,
        core: RateLimitCore | None = None,
    ) -> None:
        self.core = core if core is not None else RateLimitCore(limiter, metrics)
        self._decide = self.core.decide

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new calls from now on; wait up to ``timeout_s`` for the calls in flight.

        True when none is left.
        """
        return await self.core.drain(timeout_s)

    async def ShouldRateLimit(  # noqa: N802 (the name is fixed by the proto)
        self,
        request: RateLimitRequest | UndecodableRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> Decision:
        try:
            return await self._decide(request, context)  # the context: trace metadata
        except GrpcError as refusal:
            await context.abort(grpc.StatusCode[refusal.status.name], refusal.message)
            raise  # not reached: abort raises
