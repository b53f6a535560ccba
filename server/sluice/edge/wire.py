"""The bytes of gRPC over HTTP/2: length-prefixed frames, grpc-timeout, grpc-message,
binary metadata. https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md"""

from __future__ import annotations

import base64
import zlib

from sluice.edge.status import GrpcError, Status

__all__ = [
    "decode_metadata_value",
    "decompress",
    "encode_metadata_value",
    "frame",
    "parse_timeout",
    "percent_encode",
]

_TIMEOUT_UNITS = {
    ord("H"): 3600.0,
    ord("M"): 60.0,
    ord("S"): 1.0,
    ord("m"): 1e-3,
    ord("u"): 1e-6,
    ord("n"): 1e-9,
}


def parse_timeout(value: bytes) -> float | None:
    """Seconds in a ``grpc-timeout`` value (1 to 8 ASCII digits and a unit: H M S m u n);
    None for a malformed one, which the edge ignores as gRPC's C core does."""
    if not 2 <= len(value) <= 9:
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    digits = value[:-1]
    if unit is None or not digits.isdigit():
        return None
    return int(digits) * unit


def frame(message: bytes) -> bytes:
    """One uncompressed length-prefixed message."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def decompress(data: bytes, max_bytes: int) -> bytes:
    """A gzip-compressed message, refused when it inflates past ``max_bytes``."""
    inflater = zlib.decompressobj(wbits=31)  # gzip header and trailer
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise GrpcError(Status.INTERNAL, f"cannot decompress the gzip message: {exc}") from None
    if len(out) > max_bytes:
        raise GrpcError(
            Status.RESOURCE_EXHAUSTED,
            f"Received message larger than max (more than {max_bytes} bytes once decompressed "
            f"vs. {max_bytes})",
        )
    if not inflater.eof or inflater.unused_data:
        raise GrpcError(Status.INTERNAL, "cannot decompress the gzip message: not one gzip member")
    return out


_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("%")}


def percent_encode(message: str) -> bytes:
    """``grpc-message``: UTF-8, with bytes outside printable ASCII and '%' as %XX."""
    data = message.encode("utf-8", "replace")
    if all(b in _PLAIN for b in data):
        return data
    return b"".join(bytes((b,)) if b in _PLAIN else b"%%%02X" % b for b in data)


def decode_metadata_value(key: str, value: bytes) -> str | bytes:
    """A request header as metadata: ``-bin`` keys are base64 (padded or not) and give bytes."""
    if key.endswith("-bin"):
        try:
            return base64.b64decode(value + b"=" * (-len(value) % 4))
        except ValueError:
            return value
    return value.decode("latin-1")


def encode_metadata_value(key: str, value: str | bytes) -> bytes:
    if key.endswith("-bin"):
        raw = value if isinstance(value, bytes) else value.encode()
        return base64.b64encode(raw).rstrip(b"=")
    return value.encode("latin-1") if isinstance(value, str) else value
