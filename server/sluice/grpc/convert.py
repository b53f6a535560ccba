"""Protobuf in, domain types out, and back. Nothing else happens here."""

from __future__ import annotations

import json
import math
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

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
    "duration_parts",
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
    # model.Code and model.Unit are numbered as Envoy's enums; the stubs want their own types.
    response = rls_pb2.RateLimitResponse(overall_code=int(decision.overall_code))  # type: ignore[arg-type]
    for status in decision.statuses:
        out = response.statuses.add(code=int(status.code), limit_remaining=status.limit_remaining)
        limit = status.current_limit
        if limit is not None:
            out.current_limit.requests_per_unit = limit.requests_per_unit
            out.current_limit.unit = int(limit.unit)  # type: ignore[assignment]
            if limit.name:
                out.current_limit.name = limit.name
            seconds, nanos = duration_parts(status.duration_until_reset_s)
            out.duration_until_reset.seconds = seconds
            out.duration_until_reset.nanos = nanos
    _add_sluice_metadata(response, decision)
    for header in decision.response_headers:
        response.response_headers_to_add.append(
            base_pb2.HeaderValue(key=header.key, value=header.value)
        )
    return response


def duration_parts(seconds: float) -> tuple[int, int]:
    """Seconds as (seconds, nanos), rounded up to the microsecond: a wait is never early."""
    if type(seconds) is int:  # whole seconds: fixed windows, as envoyproxy/ratelimit reports
        return seconds, 0
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


_NOT_JSON = "body: not a valid RateLimitRequest in JSON"


def request_from_json(body: bytes) -> RateLimitRequest:
    """A RateLimitRequest in protobuf's JSON mapping, as the HTTP /json endpoint takes it."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"{_NOT_JSON}: not UTF-8 ({exc})") from exc
    try:
        document = json.loads(text, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError(f"{_NOT_JSON}: Failed to load JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise InvalidRequestError(f"{_NOT_JSON}: must be a JSON object, not {_kind(document)}")
    # json_format reports a wrong shape inside as a Python error ("'int' object is not
    # iterable"), or takes [] for an object: check the shape first, naming the field.
    _check_shape(document, rls_pb2.RateLimitRequest.DESCRIPTOR, "")
    try:
        message = json_format.ParseDict(document, rls_pb2.RateLimitRequest())
    except (json_format.ParseError, ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise InvalidRequestError(f"{_NOT_JSON}: {exc}") from exc
    return request_from_proto(message)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json_format.Parse refuses duplicate keys; ParseDict, given a dict, cannot see them.
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise ValueError(f"duplicate key {key!r}")
        document[key] = value
    return document


def _check_shape(document: dict[str, Any], descriptor: Any, path: str) -> None:
    """Raise InvalidRequestError, naming the field, where a JSON value has the wrong type for
    its field: json_format would report it as a Python error ("'int' object is not
    iterable", "expected string or bytes-like object") or even take [] for an object.
    Unknown fields, and the range of numbers, are left to json_format, which names them."""
    fields = {f.json_name: f for f in descriptor.fields} | {f.name: f for f in descriptor.fields}
    for name, value in document.items():
        field = fields.get(name)
        if field is None or value is None:
            continue
        where = f"{path}.{name}" if path else name
        if field.is_repeated:
            if not isinstance(value, list):
                raise InvalidRequestError(f"{where}: must be a JSON array, not {_kind(value)}")
            items = [(f"{where}[{i}]", item) for i, item in enumerate(value)]
        else:
            items = [(where, value)]
        message = field.message_type
        for at, item in items:
            if message is None or message.full_name.startswith("google.protobuf."):
                # A scalar, or a wrapper such as UInt64Value (in JSON, the value it wraps).
                wanted = _SCALAR_TYPES.get(field.type if message is None else "wrapper")
                if wanted is None:
                    continue
                types, what = wanted
                if not isinstance(item, types) or isinstance(item, bool) and bool not in types:
                    raise InvalidRequestError(f"{at}: must be {what}, not {_kind(item)}")
            elif not isinstance(item, dict):
                raise InvalidRequestError(f"{at}: must be a JSON object, not {_kind(item)}")
            else:
                _check_shape(item, message, at)


# JSON types the proto3 JSON mapping allows per field type (64-bit numbers may be strings).
_NUMBER = ((int, float, str), "a number")
_SCALAR_TYPES: dict[Any, tuple[tuple[type, ...], str]] = {
    FieldDescriptor.TYPE_STRING: ((str,), "a string"),
    FieldDescriptor.TYPE_UINT32: _NUMBER,
    FieldDescriptor.TYPE_UINT64: _NUMBER,
    FieldDescriptor.TYPE_ENUM: ((str, int, float), "a name or a number"),
    "wrapper": _NUMBER,  # the only wrapper in a RateLimitRequest is UInt64Value
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def decision_to_json(decision: Decision) -> str:
    return json_format.MessageToJson(
        decision_to_proto(decision), indent=None, always_print_fields_with_no_presence=True
    )
