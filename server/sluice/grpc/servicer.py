"""RateLimitService/ShouldRateLimit: convert, call the limiter, convert back."""

from __future__ import annotations

import logging

import grpc

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.errors import BackendUnavailableError, InvalidRequestError
from sluice.grpc.convert import decision_to_proto, request_from_proto
from sluice.limiter import RateLimiter

__all__ = ["RateLimitServicer"]

log = logging.getLogger(__name__)


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):
    def __init__(self, limiter: RateLimiter) -> None:
        self._limiter = limiter

    async def ShouldRateLimit(  # noqa: N802 (the name is fixed by the proto)
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext
    ) -> rls_pb2.RateLimitResponse:
        try:
            decision = await self._limiter.should_rate_limit(request_from_proto(request))
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except BackendUnavailableError as exc:
            # The failure mode is "error": let the caller's own policy (Envoy's
            # failure_mode_deny) decide, rather than guessing for it.
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception:
            # Envoy fails open on any RLS error; log it loudly so it is not silent here too.
            log.exception("ShouldRateLimit failed for domain %r", request.domain)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error deciding the request")
        return decision_to_proto(decision)
