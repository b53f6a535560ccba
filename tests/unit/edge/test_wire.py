"""The bytes of gRPC the edge reads and writes (sluice/edge/wire.py)."""

from __future__ import annotations

import gzip

import pytest

from sluice.edge import GrpcError, Status
from sluice.edge.wire import (
    decode_metadata_value,
    decompress,
    encode_metadata_value,
    frame,
    parse_timeout,
    percent_encode,
)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"1H", 3600.0),
        (b"2M", 120.0),
        (b"3S", 3.0),
        (b"250m", 0.25),
        (b"1500u", 0.0015),
        (b"99999999n", 0.099999999),
        (b"0m", 0.0),
    ],
)
def test_every_timeout_unit(value: bytes, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"1", b"1s", b"-1S", b"123456789S", b"1.5S"])
def test_malformed_timeouts_are_none(value: bytes) -> None:
    assert parse_timeout(value) is None


def test_frame_is_length_prefixed() -> None:
    assert frame(b"\x08\x01") == b"\x00\x00\x00\x00\x02\x08\x01"


def test_grpc_message_is_percent_encoded() -> None:
    assert percent_encode("plain text: ok") == b"plain text: ok"
    assert percent_encode("100% ü\n") == b"100%25 %C3%BC%0A"


def test_gzip_inflates_within_the_limit_only() -> None:
    assert decompress(gzip.compress(b"x" * 100), 100) == b"x" * 100
    with pytest.raises(GrpcError) as info:
        decompress(gzip.compress(b"x" * 101), 100)
    assert info.value.status is Status.RESOURCE_EXHAUSTED
    with pytest.raises(GrpcError) as info:
        decompress(b"not gzip", 100)
    assert info.value.status is Status.INTERNAL


def test_binary_metadata_round_trips_unpadded() -> None:
    encoded = encode_metadata_value("x-bin", b"\x00\xff")
    assert b"=" not in encoded
    assert decode_metadata_value("x-bin", encoded) == b"\x00\xff"
    assert decode_metadata_value("x-text", b"abc") == "abc"
