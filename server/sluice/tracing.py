"""OpenTelemetry tracing of ShouldRateLimit: the ``otel`` extra, on with ``--otel-tracing``.

One SERVER span per call, named ``ShouldRateLimit``, continuing the trace the caller sent in
the gRPC metadata (Envoy's ``traceparent``; any format ``OTEL_PROPAGATORS`` names), with the
attributes

- ``sluice.domain``, ``sluice.descriptors`` (how many), ``sluice.overall_code`` (``OK``,
  ``OVER_LIMIT``, or the refusal: ``invalid``, ``error``),
- ``sluice.backend_ms``: the time the call waited for the backend (absent when no descriptor
  reached it),
- ``rpc.system``, ``rpc.service``, ``rpc.method`` and ``rpc.grpc.status_code``, as
  OpenTelemetry's conventions name them; the span's status is ERROR for the codes the
  conventions count as server errors.

Spans go to an OTLP exporter (gRPC) configured by the standard variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``,
``OTEL_TRACES_SAMPLER``…; ``OTEL_TRACES_EXPORTER=console`` prints them, ``none`` sends
nothing), in batches from a thread of the SDK's.

Off (the default), nothing here is imported: app.py wires the plain ``RateLimitCore`` and the
backend as they are, so the request path is the one it is without the extra
(docs/benchmarks.md measures it). On, the core is ``TracedRateLimitCore`` and the limiter's
backend is wrapped by ``TimedBackend``: the limiter itself is not touched.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from sluice.access_log import AccessLog
from sluice.algorithms import Outcome
from sluice.backends import Backend, Hit
from sluice.edge.status import GrpcError
from sluice.errors import SluiceError
from sluice.grpc.core import RateLimitCore, UndecodableRequest
from sluice.limiter import RateLimiter
from sluice.metrics import Metrics
from sluice.model import Decision, RateLimitRequest
from sluice.settings import flag_name
from sluice.statsd import StatsdSink

__all__ = ["TimedBackend", "TracedRateLimitCore", "Tracing", "start_tracing"]

log = logging.getLogger("sluice.tracing")

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
SPAN_NAME = "ShouldRateLimit"
# Server spans: the gRPC codes OpenTelemetry's conventions count as the server's errors.
_SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)
_RPC_ATTRIBUTES = {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": SPAN_NAME}
_GRPC_CODES = {
    "OK": 0,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "RESOURCE_EXHAUSTED": 8,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
}


class Tracing:
    """The tracer the spans are made with, and the provider to flush on stop."""

    def __init__(self, tracer: trace.Tracer, provider: Any = None) -> None:
        self.tracer = tracer
        self._provider = provider

    def flush(self, timeout_s: float = 2.0) -> None:
        """Send what is batched (on stop: the process ends right after)."""
        if self._provider is not None:
            self._provider.force_flush(round(timeout_s * 1000))


def start_tracing(environ: Mapping[str, str] | None = None) -> Tracing:
    """The SDK's provider with the exporter ``OTEL_TRACES_EXPORTER`` names (otlp by default),
    its settings from the ``OTEL_*`` variables. ``SluiceError`` naming the flag when the
    ``otel`` extra is not installed."""
    environ = os.environ if environ is None else environ
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError as exc:
        raise SluiceError(
            f"{flag_name('otel_tracing')}: OpenTelemetry's SDK is not installed "
            f"({exc.name}): install sluice[otel]"
        ) from None
    # The SDK reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; "sluice" unless they say.
    named = "OTEL_SERVICE_NAME" in environ or "OTEL_RESOURCE_ATTRIBUTES" in environ
    provider = TracerProvider(
        resource=Resource.create() if named else Resource.create({"service.name": "sluice"})
    )
    exporter_name = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    exporter: SpanExporter | None
    if exporter_name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise SluiceError(
                f"{flag_name('otel_tracing')}: the OTLP exporter is not installed "
                f"({exc.name}): install sluice[otel]"
            ) from None
        exporter = OTLPSpanExporter()
    elif exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "none":
        exporter = None
    else:
        raise SluiceError(
            f"OTEL_TRACES_EXPORTER: '{exporter_name}' is not one of otlp, console, none "
            f"(with {flag_name('otel_tracing')})"
        )
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing ShouldRateLimit with OpenTelemetry, exporter %s", exporter_name)
    return Tracing(provider.get_tracer("sluice"), provider)


class TracedRateLimitCore(RateLimitCore):
    """``RateLimitCore`` with a span around each call (the module docstring)."""

    def __init__(
        self,
        limiter: RateLimiter,
        metrics: Metrics | None = None,
        statsd: StatsdSink | None = None,
        access_log: AccessLog | None = None,
        *,
        tracer: trace.Tracer,
    ) -> None:
        super().__init__(limiter, metrics, statsd, access_log)
        self._tracer = tracer

    async def decide(
        self, request: RateLimitRequest | UndecodableRequest, context: object = None
    ) -> Decision:
        parent = propagate.extract(_carrier(context))
        # Attributes given together: the SDK takes a lock per set_attribute call.
        attributes: dict[str, str | int] = dict(_RPC_ATTRIBUTES)
        if isinstance(request, RateLimitRequest):
            attributes["sluice.domain"] = request.domain
            attributes["sluice.descriptors"] = len(request.descriptors)
        with self._tracer.start_as_current_span(
            SPAN_NAME,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                decision = await super().decide(request, context)
            except GrpcError as refusal:
                name = refusal.status.name
                span.set_attributes(
                    {
                        "rpc.grpc.status_code": _GRPC_CODES.get(name, -1),
                        "sluice.overall_code": "invalid" if name == "INVALID_ARGUMENT" else "error",
                    }
                )
                if name in _SERVER_ERRORS:
                    span.set_status(Status(StatusCode.ERROR, refusal.message))
                raise
            span.set_attributes(
                {"rpc.grpc.status_code": 0, "sluice.overall_code": decision.overall_code.name}
            )
            return decision


class TimedBackend:
    """A backend whose ``apply`` sets ``sluice.backend_ms`` on the current span (the call's,
    in the call's task); everything else is the wrapped backend's."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def apply(self, hits: Sequence[Hit], now: float) -> list[tuple[Outcome, ...]]:
        started = time.perf_counter()
        try:
            return await self._backend.apply(hits, now)
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            trace.get_current_span().set_attribute("sluice.backend_ms", elapsed_ms)

    def metric_values(self) -> dict[str, float]:
        return self._backend.metric_values()

    async def close(self) -> None:
        await self._backend.close()


def _carrier(context: object) -> dict[str, str]:
    """The call's text metadata: the ASGI edge's ``Context.metadata``, or grpc.aio's
    ``invocation_metadata()``; nothing without a context."""
    if context is None:
        return {}
    invocation_metadata = getattr(context, "invocation_metadata", None)
    pairs = invocation_metadata() if invocation_metadata is not None else context.metadata  # type: ignore[attr-defined]
    return {key: value for key, value in (pairs or ()) if isinstance(value, str)}
