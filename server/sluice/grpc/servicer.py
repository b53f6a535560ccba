"""RateLimitService/ShouldRateLimit: convert, call the limiter, convert back."""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.errors import BackendUnavailableError, InvalidRequestError
from sluice.grpc.convert import decision_to_proto, request_from_proto
from sluice.limiter import RateLimiter
from sluice.metrics import Metrics

__all__ = ["RateLimitServicer"]

log = logging.getLogger(__name__)


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):
    def __init__(self, limiter: RateLimiter, metrics: Metrics | None = None) -> None:
        self._limiter = limiter
        self._latency = metrics.request_seconds if metrics is not None else None
        # code -> the histogram's child: labels() costs a lock and a dict lookup per call.
        self._observers: dict[str, Any] = {}

    async def ShouldRateLimit(  # noqa: N802 (the name is fixed by the proto)
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext
    ) -> rls_pb2.RateLimitResponse:
        started = time.perf_counter()
        code = "error"
        try:
            decision = await self._limiter.should_rate_limit(request_from_proto(request))
            code = decision.overall_code.name
        except InvalidRequestError as exc:
            code = "invalid"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except BackendUnavailableError as exc:
            # The failure mode is "error": let the caller's own policy (Envoy's
            # failure_mode_deny) decide, rather than guessing for it.
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception:
            # Envoy fails open on any RLS error; log it loudly so it is not silent here too.
            log.exception("ShouldRateLimit failed for domain %r", request.domain)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error deciding the request")
        finally:
            if self._latency is not None:
                observer = self._observers.get(code)
                if observer is None:
                    observer = self._observers[code] = self._latency.labels("grpc", code)
                observer.observe(time.perf_counter() - started)
        return decision_to_proto(decision)
