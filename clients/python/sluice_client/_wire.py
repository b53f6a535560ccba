"""The one place requests are built and responses read, shared by Client and AsyncClient.

Pure: plain values in, protobuf out, and back; no I/O, so both clients behave identically and
the conversion is tested without a server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import grpc
from google.protobuf import struct_pb2

from sluice_client._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice_client._proto.envoy.service.ratelimit.v3 import rls_pb2
from sluice_client._proto.envoy.type.v3.ratelimit_unit_pb2 import RateLimitUnit
from sluice_client.errors import InvalidRequest, SluiceUnavailable
from sluice_client.types import (
    Decision,
    Descriptor,
    DescriptorDecision,
    DescriptorLike,
    Limit,
    OnUnavailable,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "build_request",
    "check_timeout",
    "check_on_unavailable",
    "decision_from_error",
    "parse_response",
]

_UINT32_MAX = 2**32 - 1
# Envoy's request-side unit enum (envoy.type.v3.RateLimitUnit) has no WEEK.
_OVERRIDE_UNITS = {
    "second": RateLimitUnit.SECOND,
    "minute": RateLimitUnit.MINUTE,
    "hour": RateLimitUnit.HOUR,
    "day": RateLimitUnit.DAY,
    "month": RateLimitUnit.MONTH,
    "year": RateLimitUnit.YEAR,
}
# The response-side enum (RateLimitResponse.RateLimit.Unit) numbers WEEK 7.
_RESPONSE_UNITS = {1: "second", 2: "minute", 3: "hour", 4: "day", 5: "month", 6: "year", 7: "week"}
_ON_UNAVAILABLE = ("allow", "deny", "raise")

# Long enough for a round trip across a data centre, short enough that a stuck Sluice does
# not stall the request being limited for long.
DEFAULT_TIMEOUT_S = 0.5


def check_timeout(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"timeout_s: must be a number > 0, not {value!r}")
    return float(value)


def check_on_unavailable(value: str) -> OnUnavailable:
    if value not in _ON_UNAVAILABLE:
        raise ValueError(f"on_unavailable must be one of {_ON_UNAVAILABLE}, not {value!r}")
    return value  # type: ignore[return-value]  # narrowed by the check above


def build_request(
    domain: str, descriptors: Sequence[DescriptorLike], *, hits: int
) -> rls_pb2.RateLimitRequest:
    if not isinstance(domain, str) or not domain:
        raise InvalidRequest("domain: must be a non-empty string")
    # A lone mapping is a common slip for [mapping]; guessing would hide which was meant.
    if isinstance(descriptors, Mapping | Descriptor | str) or not isinstance(descriptors, Sequence):
        raise InvalidRequest("descriptors: must be a list of mappings or Descriptor objects")
    if not descriptors:
        raise InvalidRequest("descriptors: must not be empty")
    # Envoy's hits_addend 0 means 1, so 0 cannot mean "check only" at this level.
    if not isinstance(hits, int) or not 1 <= hits <= _UINT32_MAX:
        raise InvalidRequest(
            "hits: must be a whole number from 1 to 4294967295 "
            "(to check without consuming, use Descriptor(..., hits=0))"
        )
    request = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits)
    for i, item in enumerate(descriptors):
        request.descriptors.append(_descriptor(item, f"descriptors[{i}]"))
    return request


def _descriptor(item: DescriptorLike, where: str) -> ratelimit_pb2.RateLimitDescriptor:
    if isinstance(item, Mapping):
        item = Descriptor(item)
    if not isinstance(item, Descriptor):
        raise InvalidRequest(f"{where}: must be a mapping or a Descriptor, not {type(item)!r}")
    if not item.entries:
        raise InvalidRequest(f"{where}: must have at least one entry")
    out = ratelimit_pb2.RateLimitDescriptor()
    for j, (key, value) in enumerate(item.entries):
        if not isinstance(key, str) or not key:
            raise InvalidRequest(f"{where}.entries[{j}].key: must be a non-empty string")
        if not isinstance(value, str):
            raise InvalidRequest(f"{where}.entries[{j}].value: must be a string")
        out.entries.add(key=key, value=value)
    if item.hits is not None:
        if not isinstance(item.hits, int) or item.hits < 0:
            raise InvalidRequest(f"{where}.hits: must be a whole number >= 0")
        out.hits_addend.value = item.hits
    if item.limit is not None:
        unit = _OVERRIDE_UNITS.get(item.limit.unit)
        if unit is None:
            raise InvalidRequest(f"{where}.limit.unit: must be one of {', '.join(_OVERRIDE_UNITS)}")
        if not 0 <= item.limit.requests_per_unit <= _UINT32_MAX:
            raise InvalidRequest(f"{where}.limit.requests_per_unit: out of range")
        out.limit.requests_per_unit = item.limit.requests_per_unit
        out.limit.unit = unit
    return out


def parse_response(response: rls_pb2.RateLimitResponse) -> Decision:
    over = rls_pb2.RateLimitResponse.Code.OVER_LIMIT
    delays = _metadata_list(response, "sluice_delay_s", (int, float))
    reasons = _metadata_list(response, "sluice_reasons", (str,))
    statuses = []
    for i, status in enumerate(response.statuses):
        limit = None
        if status.HasField("current_limit"):
            current = status.current_limit
            limit = Limit(
                current.requests_per_unit,
                _RESPONSE_UNITS.get(current.unit, "unknown"),
                current.name,
            )
        reset = status.duration_until_reset
        statuses.append(
            DescriptorDecision(
                allowed=status.code != over,
                limit=limit,
                remaining=status.limit_remaining,
                reset_s=reset.seconds + reset.nanos / 1e9,
                delay_s=float(delays[i]) if i < len(delays) else 0.0,
                reason=str(reasons[i]) if i < len(reasons) else "",
            )
        )
    return Decision(
        # As Envoy reads it: anything but OVER_LIMIT (UNKNOWN included) lets the request pass.
        allowed=response.overall_code != over,
        statuses=tuple(statuses),
        headers=tuple((h.key, h.value) for h in response.response_headers_to_add),
    )


_T = TypeVar("_T")


def _metadata_list(
    response: rls_pb2.RateLimitResponse, name: str, types: tuple[type[_T], ...]
) -> list[_T]:
    """A list from Sluice's dynamic_metadata; empty when absent or not what Sluice writes
    (another RLS server may put anything there, and that must not break the decision)."""
    if name not in response.dynamic_metadata.fields:
        return []
    value: struct_pb2.Value = response.dynamic_metadata.fields[name]
    if value.WhichOneof("kind") != "list_value":
        return []
    items = [_plain(v) for v in value.list_value.values]
    typed = [v for v in items if isinstance(v, types)]
    return typed if len(typed) == len(items) else []


def _plain(value: struct_pb2.Value) -> object:
    kind = value.WhichOneof("kind")
    return getattr(value, kind) if kind in ("number_value", "string_value") else None


def retry_timeout_s(error: grpc.RpcError, *, left_s: float) -> float | None:
    """The timeout of the one retry a failed call gets, or None for no retry.

    Only UNAVAILABLE is retried: a Sluice shutting down refuses with it before counting
    anything, and an unreachable one never saw the call, so asking another cannot count a
    hit twice. DEADLINE_EXCEEDED, CANCELLED and the rest may follow a counted call. The retry
    gets what is left of the call's timeout, so a call never takes longer than it."""
    code = error.code() if hasattr(error, "code") else None
    if code is grpc.StatusCode.UNAVAILABLE and left_s > 0:
        return left_s
    return None


def decision_from_error(
    error: grpc.RpcError, *, descriptor_count: int, on_unavailable: OnUnavailable
) -> Decision:
    """What a failed call means under the client's ``on_unavailable`` choice (or raise)."""
    code = error.code() if hasattr(error, "code") else None
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        raise InvalidRequest(f"Sluice refused the request: {details}")
    # Every other failure means Sluice gave no decision, as Envoy's failure_mode_deny sees it.
    name = code.name if code is not None else "error"
    if on_unavailable == "raise":
        raise SluiceUnavailable(f"Sluice gave no decision ({name}): {details}", code=code)
    allowed = on_unavailable == "allow"
    status = DescriptorDecision(allowed=allowed, reason=f"Sluice unavailable ({name})")
    return Decision(allowed=allowed, statuses=(status,) * descriptor_count, degraded=True)
