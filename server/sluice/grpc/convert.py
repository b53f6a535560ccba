"""Protobuf in, domain types out, and back. Nothing else happens here."""

from __future__ import annotations

import math

from google.protobuf import json_format

from sluice._proto.envoy.config.core.v3 import base_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2
from sluice.errors import InvalidRequestError
from sluice.model import (
    Decision,
    Descriptor,
    LimitOverride,
    RateLimitRequest,
    Unit,
)

__all__ = [
    "decision_to_json",
    "decision_to_proto",
    "request_from_json",
    "request_from_proto",
]

_UNITS = {int(u): u for u in Unit}


def request_from_proto(message: rls_pb2.RateLimitRequest) -> RateLimitRequest:
    descriptors = []
    for d in message.descriptors:
        limit = None
        if d.HasField("limit"):
            limit = LimitOverride(d.limit.requests_per_unit, _UNITS.get(d.limit.unit, Unit.UNKNOWN))
        descriptors.append(
            Descriptor(
                entries=tuple((e.key, e.value) for e in d.entries),
                limit=limit,
                hits_addend=d.hits_addend.value if d.HasField("hits_addend") else None,
            )
        )
    return RateLimitRequest(message.domain, tuple(descriptors), message.hits_addend)


def decision_to_proto(decision: Decision) -> rls_pb2.RateLimitResponse:
    response = rls_pb2.RateLimitResponse(overall_code=int(decision.overall_code))
    for status in decision.statuses:
        out = response.statuses.add(code=int(status.code), limit_remaining=status.limit_remaining)
        limit = status.current_limit
        if limit is not None:
            out.current_limit.requests_per_unit = limit.requests_per_unit
            out.current_limit.unit = int(limit.unit)
            if limit.name:
                out.current_limit.name = limit.name
            seconds, nanos = _duration(status.duration_until_reset_s)
            out.duration_until_reset.seconds = seconds
            out.duration_until_reset.nanos = nanos
    _add_sluice_metadata(response, decision)
    for header in decision.response_headers:
        response.response_headers_to_add.append(
            base_pb2.HeaderValue(key=header.key, value=header.value)
        )
    return response


def _duration(seconds: float) -> tuple[int, int]:
    """Seconds as (seconds, nanos), rounded up to the microsecond: a wait is never early."""
    micros = math.ceil(round(seconds * 1_000_000, 3))
    return micros // 1_000_000, (micros % 1_000_000) * 1000


def _add_sluice_metadata(response: rls_pb2.RateLimitResponse, decision: Decision) -> None:
    """What Envoy's API has no field for, per descriptor: how long a leaky-bucket request
    should wait its turn, and why a request can never be admitted. Envoy ignores it; the
    Sluice clients read it. Absent when there is nothing to say (the common case)."""
    delays = [s.delay_s for s in decision.statuses]
    reasons = [s.reason for s in decision.statuses]
    if any(delays):
        response.dynamic_metadata["sluice_delay_s"] = delays
    if any(reasons):
        response.dynamic_metadata["sluice_reasons"] = reasons


def request_from_json(body: bytes) -> RateLimitRequest:
    """A RateLimitRequest in protobuf's JSON mapping, as the HTTP /json endpoint takes it."""
    try:
        message = json_format.Parse(body.decode("utf-8"), rls_pb2.RateLimitRequest())
    except (json_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidRequestError(f"body: not a valid RateLimitRequest in JSON: {exc}") from exc
    return request_from_proto(message)


def decision_to_json(decision: Decision) -> str:
    return json_format.MessageToJson(
        decision_to_proto(decision), indent=None, always_print_fields_with_no_presence=True
    )
