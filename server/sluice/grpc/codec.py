"""ShouldRateLimit's messages straight between bytes and domain types, on the request path.

Going through protobuf's Python objects costs more than the decision itself: every field read
on a parsed message builds a wrapper object (about 5 µs to turn a one-entry request into a
``RateLimitRequest``, 3.5 µs to build and serialize the response). These functions read and
write the wire format directly for the messages Envoy and the clients actually send, and hand
anything else to protobuf, so the result is always the one ``sluice.grpc.convert`` gives:

- ``parse_request`` reads a request made only of the fields Sluice decides by, each once
  (domain, descriptors of entries with an optional ``hits_addend``, the request's
  ``hits_addend``). Anything else (a client ``limit``, unknown fields, a field repeated, a
  length past the end, text that is not UTF-8, a 64-bit number where 32 bits go) is parsed by
  protobuf, which also raises ``DecodeError`` for bytes that are not a request at all.
- ``encode_decision`` writes a response as ``decision_to_proto(...).SerializeToString()``
  parses, except that it leaves to that route the responses that carry Sluice's metadata
  (delays and reasons, which are a protobuf ``Struct``) or a number out of its field's range
  (so that the same error is raised).

Both are checked against protobuf by differential property tests (tests/unit/grpc).
"""

from __future__ import annotations

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2
from sluice.grpc.convert import decision_to_proto, duration_parts, request_from_proto
from sluice.model import Decision, Descriptor, RateLimit, RateLimitRequest

__all__ = ["encode_decision", "parse_request"]

_UINT32 = 1 << 32
_UINT64 = 1 << 64


class _Unusual(Exception):
    """The bytes are not in the common shape: protobuf reads them instead."""


def parse_request(data: bytes) -> RateLimitRequest:
    """The request in ``data``; ``google.protobuf.message.DecodeError`` if it is none."""
    try:
        return _request(data)
    except (_Unusual, IndexError, UnicodeDecodeError):
        return request_from_proto(rls_pb2.RateLimitRequest.FromString(data))


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it (IndexError past the end)."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    while True:
        pos += 1
        byte = data[pos]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos + 1
        shift += 7
        if shift > 63:
            raise _Unusual


def _request(data: bytes) -> RateLimitRequest:
    domain: str | None = None
    descriptors: list[Descriptor] = []
    hits_addend: int | None = None
    pos, end = 0, len(data)
    while pos < end:
        tag = data[pos]
        if tag == 0x12:  # descriptors, length-delimited
            length, pos = _varint(data, pos + 1)
            stop = pos + length
            if stop > end:
                raise _Unusual
            descriptors.append(_descriptor(data, pos, stop))
            pos = stop
        elif tag == 0x0A and domain is None:  # domain
            length, pos = _varint(data, pos + 1)
            stop = pos + length
            if stop > end:
                raise _Unusual
            domain = data[pos:stop].decode()
            pos = stop
        elif tag == 0x18 and hits_addend is None:  # hits_addend, uint32
            hits_addend, pos = _varint(data, pos + 1)
            if hits_addend >= _UINT32:
                raise _Unusual
        else:
            raise _Unusual
    return RateLimitRequest(domain or "", tuple(descriptors), hits_addend or 0)


def _descriptor(data: bytes, pos: int, end: int) -> Descriptor:
    entries: list[tuple[str, str]] = []
    hits_addend: int | None = None
    while pos < end:
        tag = data[pos]
        length, pos = _varint(data, pos + 1)
        stop = pos + length
        if stop > end:
            raise _Unusual
        if tag == 0x0A:  # an entry: key = 1, value = 2, each at most once, in order
            key = value = ""
            if pos < stop and data[pos] == 0x0A:
                length, pos = _varint(data, pos + 1)
                key = data[pos : pos + length].decode()
                pos += length
            if pos < stop and data[pos] == 0x12:
                length, pos = _varint(data, pos + 1)
                value = data[pos : pos + length].decode()
                pos += length
            if pos != stop:
                raise _Unusual
            entries.append((key, value))
        elif tag == 0x1A and hits_addend is None:  # hits_addend: UInt64Value {value = 1}
            hits_addend = 0
            if pos < stop:
                if data[pos] != 0x08:
                    raise _Unusual
                hits_addend, pos = _varint(data, pos + 1)
                if hits_addend >= _UINT64:
                    raise _Unusual
            if pos != stop:
                raise _Unusual
        else:
            raise _Unusual  # a client limit, or anything unknown
        pos = stop
    return Descriptor(tuple(entries), None, hits_addend)


def encode_decision(decision: Decision) -> bytes:
    """The RateLimitResponse for ``decision``, serialized."""
    try:
        return _response(decision)
    except _Unusual:
        return decision_to_proto(decision).SerializeToString()


def _uvarint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL[value]
    if 0x80 <= value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0 or value >= _UINT64:
        raise _Unusual
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _uint32(value: int) -> bytes:
    if not 0 <= value < _UINT32:
        raise _Unusual  # decision_to_proto raises ValueError, naming the field
    return _uvarint(value)


_SMALL = [bytes((i,)) for i in range(0x80)]


def _length_delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _uvarint(len(payload)) + payload


def _current_limit(limit: RateLimit) -> bytes:
    """Field 2 of a DescriptorStatus, whole."""
    current = b"\x08" + _uint32(limit.requests_per_unit) if limit.requests_per_unit else b""
    if limit.unit:
        current += b"\x10" + _SMALL[limit.unit]
    if limit.name:
        current += _length_delimited(b"\x1a", limit.name.encode())
    return _length_delimited(b"\x12", current)


def _response(decision: Decision) -> bytes:
    parts = [b"\x08" + _SMALL[decision.overall_code]] if decision.overall_code else []
    for status in decision.statuses:
        if status.delay_s or status.reason:
            raise _Unusual  # Sluice's metadata: a protobuf Struct
        body = b"\x08" + _SMALL[status.code] if status.code else b""
        limit = status.current_limit
        if limit is not None:
            body += _current_limit(limit)
        if status.limit_remaining:
            body += b"\x18" + _uint32(status.limit_remaining)
        if limit is not None:
            seconds, nanos = duration_parts(status.duration_until_reset_s)
            reset = b"\x08" + _uvarint(seconds) if seconds else b""
            if nanos:
                reset += b"\x10" + _uvarint(nanos)
            body += _length_delimited(b"\x22", reset)
        parts.append(_length_delimited(b"\x12", body))
    for header in decision.response_headers:
        pair = _length_delimited(b"\x0a", header.key.encode()) if header.key else b""
        if header.value:
            pair += _length_delimited(b"\x12", header.value.encode())
        parts.append(_length_delimited(b"\x1a", pair))
    return b"".join(parts)
