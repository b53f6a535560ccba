"""OpenTelemetry spans of ShouldRateLimit (``--otel-tracing``, sluice/tracing.py), continuing
the trace a caller sends in the ``traceparent`` metadata, on both transports: grpc.aio in
process into the SDK's in-memory exporter, and ``sluice serve --transport pyvoy`` (Sluice
inside Envoy) configured by the OTEL_* variables alone, its spans printed by the console
exporter."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.app import Sluice
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.settings import Settings
from sluice.tracing import Tracing
from tests.support.processes import sluice_serve

POLICY = """\
domain: traced
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
"""
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def _request(domain: str = "traced", descriptors: int = 2) -> rls_pb2.RateLimitRequest:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value="ada")
    return rls_pb2.RateLimitRequest(
        domain=domain,
        descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])] * descriptors,
    )


async def _traced_calls(exporter: InMemorySpanExporter) -> list[grpc.StatusCode]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = Settings(
        host="127.0.0.1", grpc_port=0, http_port=0, transport="grpcio", otel_tracing=True
    )
    sluice = Sluice(settings, tracing=Tracing(provider.get_tracer("test"), provider))
    sluice.snapshot = Snapshot(load_text(POLICY))
    await sluice.start()
    codes = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{sluice.grpc_port}") as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            # Two descriptors on one counter with a limit of 1: OVER_LIMIT.
            await stub.ShouldRateLimit(_request(), metadata=(("traceparent", TRACEPARENT),))
            await stub.ShouldRateLimit(_request("unknown", 1))  # no trace sent: a new one
            try:
                await stub.ShouldRateLimit(_request(""), metadata=(("traceparent", TRACEPARENT),))
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code())
    finally:
        await sluice.stop()
    return codes


def test_a_span_per_call_continues_the_callers_trace() -> None:
    exporter = InMemorySpanExporter()
    assert asyncio.run(_traced_calls(exporter)) == [grpc.StatusCode.INVALID_ARGUMENT]
    over, unknown, invalid = exporter.get_finished_spans()

    assert over.name == "ShouldRateLimit" and over.kind is SpanKind.SERVER
    assert over.context is not None and over.parent is not None
    assert format(over.context.trace_id, "032x") == TRACE_ID
    assert format(over.parent.span_id, "016x") == PARENT_ID
    assert over.parent.is_remote
    attributes = dict(over.attributes or {})
    backend_ms = attributes.pop("sluice.backend_ms")
    assert isinstance(backend_ms, float) and 0 <= backend_ms < 5000
    assert attributes == {
        "rpc.system": "grpc",
        "rpc.service": "envoy.service.ratelimit.v3.RateLimitService",
        "rpc.method": "ShouldRateLimit",
        "rpc.grpc.status_code": 0,
        "sluice.domain": "traced",
        "sluice.descriptors": 2,
        "sluice.overall_code": "OVER_LIMIT",
    }
    assert over.status.status_code is StatusCode.UNSET

    # No traceparent: a trace of its own. No rule matched: the backend was not asked.
    assert unknown.parent is None and unknown.context.trace_id != over.context.trace_id
    assert unknown.attributes["sluice.overall_code"] == "OK"
    assert "sluice.backend_ms" not in unknown.attributes

    # Refused as invalid: the caller's fault, so not an error of this server's span.
    assert format(invalid.parent.span_id, "016x") == PARENT_ID
    assert invalid.attributes["sluice.overall_code"] == "invalid"
    assert invalid.attributes["rpc.grpc.status_code"] == 3
    assert invalid.status.status_code is StatusCode.UNSET


def _spans_in(log: str) -> list[dict]:
    """The console exporter's spans: indented JSON objects among the log lines."""
    decoder = json.JSONDecoder()
    spans, position = [], 0
    while (start := log.find("{\n", position)) >= 0:
        try:
            value, position = decoder.raw_decode(log, start)
        except ValueError:
            position = start + 1
            continue
        if isinstance(value, dict) and "context" in value:
            spans.append(value)
    return spans


@pytest.mark.slow
def test_under_pyvoy_the_otel_variables_configure_the_exporter(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "sluice-under-test"}
    args = ["--transport", "pyvoy", "--otel-tracing"]
    with sluice_serve(tmp_path, config=policy, extra_args=args, env=env) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            response = stub.ShouldRateLimit(
                _request(descriptors=1), metadata=(("traceparent", TRACEPARENT),), timeout=5
            )
        assert response.overall_code == rls_pb2.RateLimitResponse.OK
    # Stopped: the spans batched are flushed on the way out.
    [span] = [s for s in _spans_in(server.log()) if s["name"] == "ShouldRateLimit"]
    assert span["context"]["trace_id"] == f"0x{TRACE_ID}"
    assert span["parent_id"] == f"0x{PARENT_ID}"
    assert span["kind"] == "SpanKind.SERVER"
    assert span["attributes"]["sluice.domain"] == "traced"
    assert span["attributes"]["sluice.overall_code"] == "OK"
    assert span["resource"]["attributes"]["service.name"] == "sluice-under-test"
