"""ShouldRateLimit without a transport: convert, call the limiter, convert back, and drain.

Both gRPC transports (grpc.aio in grpc/servicer.py, the ASGI edge served by pyvoy in
sluice/pyvoy_app.py) answer through ``RateLimitCore.decide``: the same conversion, the same
error mapping (``sluice.errors.status_of``), the same latency metric and the same drain.
A refusal is raised as ``GrpcError`` (``sluice.edge.status``) carrying a gRPC status and
message: the ASGI edge answers it as is, and grpc.aio's servicer aborts the call with it.

Draining (``drain()``, on shutdown): new calls are refused with UNAVAILABLE, which a client
may safely retry on another instance (the call changed nothing here), while the calls already
deciding finish.

Bytes that are not a RateLimitRequest get INVALID_ARGUMENT saying why (``decode_request``):
a deserializer that raised would leave grpc.aio to answer UNKNOWN with a Python type name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError, Message

from sluice.access_log import AccessLog
from sluice.edge.status import GrpcError, Status
from sluice.errors import InvalidRequestError, SluiceError, status_of
from sluice.grpc.codec import parse_request
from sluice.limiter import RateLimiter
from sluice.metrics import Metrics
from sluice.model import Code, Decision, RateLimitRequest
from sluice.statsd import StatsdSink

__all__ = [
    "DRAINING_MESSAGE",
    "Draining",
    "RateLimitCore",
    "UndecodableRequest",
    "decode_request",
    "protobuf_decoder",
]

log = logging.getLogger("sluice.grpc.servicer")  # the logger name the logs have always had

DRAINING_MESSAGE = "shutting down: retry on another instance"
INTERNAL_MESSAGE = "internal error deciding the request"


class UndecodableRequest:
    """What ``decode_request`` passes on in place of bytes protobuf could not parse."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def protobuf_decoder(cls: type[Message]) -> Callable[[bytes], Any]:
    """A request deserializer for protobuf messages of ``cls`` that never raises: bytes it
    cannot parse become an ``UndecodableRequest`` the handler refuses with INVALID_ARGUMENT
    (a raising deserializer leaves grpc.aio to answer UNKNOWN with a Python type name)."""

    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            return UndecodableRequest(
                f"request: not a {cls.__name__} in protobuf's wire format: {exc}"
            )

    return decode


def decode_request(data: bytes) -> RateLimitRequest | UndecodableRequest:
    """The request deserializer to register ShouldRateLimit with: it never raises.
    (``sluice.grpc.codec.encode_decision`` is the response serializer.)"""
    try:
        return parse_request(data)
    except DecodeError as exc:
        return UndecodableRequest(
            f"request: not a RateLimitRequest in protobuf's wire format: {exc}"
        )


class Draining:
    """The in-flight count and drain of a gRPC service's calls.

    Subclasses count their calls inline (``_in_flight``, and ``_idle.set()`` when the last
    one ends while draining) rather than through a method: on ShouldRateLimit's path a call
    costs more than the counting itself."""

    def __init__(self) -> None:
        self._in_flight = 0
        self._draining = False
        self._idle = asyncio.Event()

    @property
    def draining(self) -> bool:
        return self._draining

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new calls from now on; wait up to ``timeout_s`` for the calls in flight.

        True when none is left.
        """
        self._draining = True
        if self._in_flight == 0:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class RateLimitCore(Draining):
    def __init__(
        self,
        limiter: RateLimiter,
        metrics: Metrics | None = None,
        statsd: StatsdSink | None = None,
        access_log: AccessLog | None = None,
    ) -> None:
        self._limiter = limiter
        self._statsd = statsd
        self._access_log = access_log  # None unless sampling and at DEBUG
        self.internal_errors = 0  # calls answered INTERNAL (upstream's service_error)
        self._latency = metrics.request_seconds if metrics is not None else None
        # code -> the histogram's child: labels() costs a lock and a dict lookup per call.
        self._observers: dict[str, Any] = {}
        super().__init__()

    async def decide(
        self, request: RateLimitRequest | UndecodableRequest, context: object = None
    ) -> Decision:
        """The response to one ShouldRateLimit call, or ``GrpcError`` saying which status.

        ``context``: the transport's call context (the edge calls this method as the handler
        itself), read only by the access log (the peer) and the traced core (metadata)."""
        if self._draining:
            raise GrpcError(Status.UNAVAILABLE, DRAINING_MESSAGE)
        started = time.perf_counter()
        code = "error"
        self._in_flight += 1
        try:
            if isinstance(request, UndecodableRequest):
                raise InvalidRequestError(request.reason)
            decision = await self._limiter.should_rate_limit(request)
            code = _CODE_NAMES[decision.overall_code]
        except SluiceError as exc:
            # Bad input, or (failure mode "error") unreachable state: the status says which,
            # and the caller's own policy (Envoy's failure_mode_deny) decides the rest.
            status = status_of(exc)
            if status is None:
                self.internal_errors += 1
                log.exception("ShouldRateLimit failed for domain %r", _domain(request))
                raise GrpcError(Status.INTERNAL, INTERNAL_MESSAGE) from None
            if isinstance(exc, InvalidRequestError):
                code = "invalid"
            raise GrpcError(Status[status.grpc], str(exc)) from None
        except Exception:
            # Envoy fails open on any RLS error; log it loudly so it is not silent here too.
            self.internal_errors += 1
            log.exception("ShouldRateLimit failed for domain %r", _domain(request))
            raise GrpcError(Status.INTERNAL, INTERNAL_MESSAGE) from None
        finally:
            self._in_flight -= 1
            if self._draining and self._in_flight == 0:
                self._idle.set()
            elapsed = time.perf_counter() - started
            if self._latency is not None:
                observer = self._observers.get(code)
                if observer is None:
                    observer = self._observers[code] = self._latency.labels("grpc", code)
                observer.observe(elapsed)
            if self._statsd is not None:
                self._statsd.observe_request(elapsed)
            if self._access_log is not None:
                self._access_log.observe(request, code, elapsed, context)
        return decision


_CODE_NAMES = {code: code.name for code in Code}  # Enum.name is a property: slower per call


def _domain(request: RateLimitRequest | UndecodableRequest) -> str:
    return "" if isinstance(request, UndecodableRequest) else request.domain
