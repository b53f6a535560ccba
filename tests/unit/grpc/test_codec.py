"""The request path's own wire codec against protobuf: for any bytes, ``parse_request`` gives
what protobuf plus ``request_from_proto`` give (or both refuse), and ``encode_decision``
writes what ``decision_to_proto`` serializes."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2
from sluice.grpc.codec import encode_decision, parse_request
from sluice.grpc.convert import decision_to_proto, request_from_proto
from sluice.model import Code, Decision, DescriptorStatus, Header, RateLimit, RateLimitRequest, Unit
from tests.support.examples import examples

# Short and long (two-byte lengths), ASCII and not.
text = st.one_of(st.text(max_size=8), st.text(min_size=120, max_size=300), st.just(""))
uint32 = st.integers(0, 2**32 - 1)


@st.composite
def descriptors(draw: st.DrawFn) -> ratelimit_pb2.RateLimitDescriptor:
    d = ratelimit_pb2.RateLimitDescriptor()
    for key, value in draw(st.lists(st.tuples(text, text), max_size=4)):
        d.entries.add(key=key, value=value)
    if draw(st.booleans()):
        d.hits_addend.value = draw(st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1)))
    if draw(st.integers(0, 5)) == 0:
        d.limit.requests_per_unit = draw(uint32)
        d.limit.unit = draw(st.integers(0, 7))
    return d


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    message = rls_pb2.RateLimitRequest(domain=draw(text), hits_addend=draw(uint32))
    message.descriptors.extend(draw(st.lists(descriptors(), max_size=4)))
    data = message.SerializeToString()
    if draw(st.integers(0, 3)) == 0:  # the same fields again: protobuf merges or overwrites
        data += draw(st.sampled_from([data, b"\x0a\x01x", b"\x18\x05", b"\x12\x00"]))
    return data


def protobuf_reading(data: bytes) -> RateLimitRequest | type[DecodeError]:
    try:
        return request_from_proto(rls_pb2.RateLimitRequest.FromString(data))
    except DecodeError:
        return DecodeError


def codec_reading(data: bytes) -> RateLimitRequest | type[DecodeError]:
    try:
        return parse_request(data)
    except DecodeError:
        return DecodeError


@settings(max_examples=examples(600), deadline=None)
@given(data=st.one_of(requests(), st.binary(max_size=64)))
@example(data=b"\x0a\x02\xff\xfe")  # a domain that is not UTF-8
@example(data=b"\x12\x04\x0a\x02\x0a\xed")  # a key cut inside a UTF-8 sequence
@example(data=b"\x12\x02\x0a\x03")  # an entry longer than its descriptor
@example(data=b"\x18\x80\x80\x80\x80\x10")  # a hits_addend past 32 bits
@example(data=b"\x12\x03\x1a\x01\x08")  # a descriptor hits_addend cut off
@example(data=b"\x12\x04\x0a\x02\x12\x00\x0a\x00")  # an entry's value before its key
def test_parse_request_reads_what_protobuf_reads(data: bytes) -> None:
    assert codec_reading(data) == protobuf_reading(data)


def test_parse_request_reads_the_common_request_itself() -> None:
    message = rls_pb2.RateLimitRequest(domain="edge", hits_addend=2)
    d = message.descriptors.add()
    d.entries.add(key="user", value="é" * 200)
    d.hits_addend.value = 0
    assert parse_request(message.SerializeToString()) == request_from_proto(message)


limits = st.builds(
    RateLimit,
    requests_per_unit=uint32,
    unit=st.sampled_from(Unit),
    name=text,
)
statuses = st.builds(
    DescriptorStatus,
    code=st.sampled_from(Code),
    current_limit=st.none() | limits,
    limit_remaining=uint32,
    duration_until_reset_s=st.floats(0, 10**9, allow_nan=False) | st.integers(0, 3600),
    delay_s=st.just(0.0) | st.floats(0, 100),
    reason=st.just("") | text,
)
decisions = st.builds(
    Decision,
    overall_code=st.sampled_from(Code),
    statuses=st.lists(statuses, max_size=4).map(tuple),
    response_headers=st.lists(st.builds(Header, key=text, value=text), max_size=3).map(tuple),
)


@settings(max_examples=examples(600), deadline=None)
@given(decision=decisions)
def test_encode_decision_writes_what_protobuf_writes(decision: Decision) -> None:
    expected = decision_to_proto(decision)
    data = encode_decision(decision)
    assert rls_pb2.RateLimitResponse.FromString(data) == expected
    assert data == expected.SerializeToString()


def test_a_number_out_of_range_raises_as_protobuf_does() -> None:
    too_many = DescriptorStatus(Code.OK, RateLimit(2**32, Unit.SECOND), 1, 1.0)
    with pytest.raises(ValueError):
        encode_decision(Decision(Code.OK, (too_many,)))
