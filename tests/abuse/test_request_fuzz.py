"""Fuzzing the request path: whatever a caller sends, Sluice answers.

Generated RateLimitRequests (huge and empty counts, deep and long descriptors, odd unicode,
extreme hits_addend at both levels, limit overrides with every unit, unknown enum numbers
included) go through the request path in-process (protobuf -> convert -> RateLimiter over a
memory backend on a manual clock -> protobuf and JSON) for volume, and over gRPC to a real
``sluice serve`` for the status codes. The outcome is always a well-formed decision, or
INVALID_ARGUMENT whose message names the first offending field and says why: the field is
predicted here from the request and the documented bounds, not read back from the server.
Raw bytes sent as the request message get a decision or INVALID_ARGUMENT (saying that they
are not a RateLimitRequest, or naming the field out of bounds), and the server answers the
next valid call.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.backends.memory import MemoryBackend
from sluice.backends.over_limit_cache import OverLimitCache
from sluice.bounds import RequestBounds
from sluice.clock import ManualClock
from sluice.errors import InvalidRequestError
from sluice.grpc.convert import decision_to_json, decision_to_proto, request_from_proto
from sluice.limiter import LimiterSettings, RateLimiter
from sluice.model import Code, Decision
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.usage.recorder import UsageRecorder
from tests.abuse._volume import TIMEOUT_S, cases
from tests.support.processes import SluiceProcess, sluice_serve

pytestmark = pytest.mark.timeout(TIMEOUT_S)

# Every algorithm, the extreme limits, unlimited, wildcards, nesting, shadow mode, replaces.
POLICY = """
domain: fuzz
descriptors:
  - key: fw
    rate_limit: {name: fw, unit: second, requests_per_unit: 5}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window_log}
  - key: swc
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window_counter}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: token_bucket, burst: 7}
  - key: lb
    rate_limit: {unit: day, requests_per_unit: 2, algorithm: leaky_bucket}
  - key: gcra
    rate_limit: {unit: week, requests_per_unit: 4294967295, algorithm: gcra, burst: 4294967295}
  - key: zero
    rate_limit: {unit: year, requests_per_unit: 0}
  - key: max
    rate_limit: {unit: month, requests_per_unit: 4294967295}
  - key: free
    rate_limit: {unlimited: true, replaces: [{name: fw}]}
  - key: multi
    rate_limit:
      name: multi
      limits:
        - {unit: second, requests_per_unit: 1}
        - {unit: minute, requests_per_unit: 4294967295, algorithm: gcra, burst: 1}
        - {unit: hour, requests_per_unit: 2, algorithm: sliding_window_log}
  - key: wild
    value: "*\u200f*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket}
  - key: wild
    value: "😀*"
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: deep
    descriptors:
      - key: deep
        descriptors:
          - key: deep
            rate_limit: {unit: second, requests_per_unit: 1}
      - key: fw
        rate_limit: {unit: hour, requests_per_unit: 3, algorithm: leaky_bucket, burst: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0}
"""
DOMAIN = "fuzz"
SNAPSHOT = Snapshot(load_text(POLICY, "fuzz.yaml"))
BOUNDS = RequestBounds()  # the defaults, as `sluice serve` runs without flags
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
START = 1_700_000_000.0
RLS_METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
MAX_RECEIVE_BYTES = 4 * 1024 * 1024  # the server's grpc.max_receive_message_length
NOT_PROTOBUF = re.compile(
    r"request: not a RateLimitRequest in protobuf's wire format: Error parsing message with "
    r"type 'envoy\.service\.ratelimit\.v3\.RateLimitRequest'(: .+)?"
)

Entry = ratelimit_pb2.RateLimitDescriptor.Entry

# --- strategies -----------------------------------------------------------------------------------

ODD = [
    "\x00",  # NUL
    "\u200f",  # right-to-left mark
    "\u202e",  # right-to-left override
    "\u0301",  # combining acute accent
    "e\u0301",
    "\ufeff",  # byte-order mark
    "😀",
    "👩‍👩‍👧",  # a zero-width-joiner sequence
    "\U0010ffff",  # the last code point
    "*",
    ":",
    "{",
    "}",
    "%",
    "#",
    "\n",
    " ",
    "\\",
    '"',
    ",",
]


def mostly(
    common: st.SearchStrategy, rare: st.SearchStrategy, one_in: int = 10
) -> st.SearchStrategy:
    """``rare`` about once in ``one_in`` draws, else ``common``: enough requests stay valid to
    reach the limiter and the backend, while every kind of bad field still comes up."""
    return st.integers(1, one_in).flatmap(lambda n: rare if n == 1 else common)


nonempty_text = st.one_of(
    st.sampled_from(["a", "fw", "*"] + ODD),
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=8),
    st.lists(st.sampled_from(ODD), min_size=1, max_size=8).map("".join),
)
# Long strings by repetition: around and far past the bounds, without generating each char.
long_text = st.builds(lambda s, n: s * n, nonempty_text, st.integers(1, 1100))
odd_text = st.one_of(st.just(""), long_text)  # empty, or long enough to break a bound
policy_keys = st.sampled_from(
    ["fw", "log", "swc", "tb", "lb", "gcra", "zero", "max", "free", "multi", "wild", "deep"]
    + ["shadow"]
)
keys = mostly(st.one_of(policy_keys, policy_keys, nonempty_text), odd_text, one_in=40)
values = st.one_of(
    st.sampled_from(["", "v", "😀", "😀x", "a\u200fb", "\u200f"]),
    nonempty_text,
    mostly(nonempty_text, long_text, one_in=8),
)
entry = st.builds(lambda k, v: Entry(key=k, value=v), keys, values)
entries = mostly(st.lists(entry, min_size=1, max_size=3), st.lists(entry, max_size=18), one_in=4)

units = mostly(
    st.integers(1, 7),  # the real units
    st.one_of(
        st.sampled_from(list(range(0, 9))),  # UNKNOWN and the first unknown numbers too
        st.integers(-(2**31), 2**31 - 1),  # an open enum on the wire: any int32
    ),
    one_in=4,
)
uint32 = st.one_of(
    st.sampled_from([0, 1, 2, UINT32_MAX - 1, UINT32_MAX]), st.integers(0, UINT32_MAX)
)
uint64 = st.one_of(
    st.sampled_from([0, 1, UINT32_MAX, UINT32_MAX + 1, UINT64_MAX]), st.integers(0, UINT64_MAX)
)


@st.composite
def descriptors(draw: st.DrawFn) -> ratelimit_pb2.RateLimitDescriptor:
    message = ratelimit_pb2.RateLimitDescriptor(entries=draw(entries))
    if draw(st.integers(0, 3)) == 0:
        message.limit.requests_per_unit = draw(uint32)
        message.limit.unit = draw(units)
    if draw(st.booleans()):
        message.hits_addend.value = draw(uint64)
    return message


descriptor_lists = mostly(
    st.lists(descriptors(), min_size=1, max_size=6),
    st.one_of(
        st.just([]),
        # Many descriptors: one repeated up to and past the maximum of 64.
        st.builds(lambda d, n: [d] * n, descriptors(), st.integers(1, 70)),
    ),
    one_in=6,
)


@st.composite
def requests(draw: st.DrawFn) -> rls_pb2.RateLimitRequest:
    domain = draw(mostly(st.just(DOMAIN), st.one_of(nonempty_text, odd_text), one_in=6))
    return rls_pb2.RateLimitRequest(
        domain=domain, descriptors=draw(descriptor_lists), hits_addend=draw(uint32)
    )


# --- the expected outcome -------------------------------------------------------------------------

_REASON = re.compile(r"must not be empty|\d+ \w+, more than the maximum of \d+|must be one of .+")


def expected_field(request: rls_pb2.RateLimitRequest) -> str | None:
    """The field an INVALID_ARGUMENT must name (the first out of bounds), or None if valid."""
    if not request.domain or len(request.domain) > BOUNDS.max_domain_length:
        return "domain"
    if not request.descriptors or len(request.descriptors) > BOUNDS.max_descriptors:
        return "descriptors"
    for i, descriptor in enumerate(request.descriptors):
        if not descriptor.entries or len(descriptor.entries) > BOUNDS.max_entries:
            return f"descriptors[{i}].entries"
        for j, entry in enumerate(descriptor.entries):
            if not entry.key or len(entry.key) > BOUNDS.max_key_length:
                return f"descriptors[{i}].entries[{j}].key"
            if len(entry.value) > BOUNDS.max_value_length:
                return f"descriptors[{i}].entries[{j}].value"
        if descriptor.HasField("limit") and not 1 <= descriptor.limit.unit <= 7:
            return f"descriptors[{i}].limit.unit"
    return None


def assert_names(message: str, field: str) -> None:
    prefix = f"{field}: "
    assert message.startswith(prefix), (message, field)
    assert _REASON.fullmatch(message[len(prefix) :]), message


def assert_well_formed(decision: Decision, request: rls_pb2.RateLimitRequest, shadow: bool) -> None:
    """The decision fits the wire types and is consistent with itself."""
    assert len(decision.statuses) == len(request.descriptors)
    over = any(s.code is Code.OVER_LIMIT for s in decision.statuses)
    assert decision.overall_code is (Code.OVER_LIMIT if over and not shadow else Code.OK)
    for status in decision.statuses:
        assert status.code in (Code.OK, Code.OVER_LIMIT)
        assert 0 <= status.limit_remaining <= UINT32_MAX
        assert math.isfinite(status.duration_until_reset_s) and status.duration_until_reset_s >= 0
        assert math.isfinite(status.delay_s) and status.delay_s >= 0
    response = decision_to_proto(decision)  # raises on anything out of range for a field
    assert rls_pb2.RateLimitResponse.FromString(response.SerializeToString()) == response
    decision_to_json(decision)


# --- in-process: volume ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.slow
@settings(
    max_examples=cases(ci=500, nightly=70_000),
    deadline=None,  # a request of 64 long descriptors is slow on a busy machine, not wrong
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    request=requests(),
    max_keys=st.integers(1, 64),
    cached=st.booleans(),
    shadow=st.booleans(),
    headers=st.booleans(),
    later_s=st.sampled_from([0.0, 0.001, 0.5, 1.0, 59.999, 3600.0, 1e9]),
)
# The edges, always run:
@example(  # found by the nightly run: a full memory backend evicted a key of the hit it applied
    request=rls_pb2.RateLimitRequest(
        domain=DOMAIN,
        descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key="multi", value="a")])]
        * 2,
    ),
    max_keys=1,
    cached=False,
    shadow=False,
    headers=False,
    later_s=0.0,
)
@example(  # the largest descriptor-level cost on a limit that can never fit it
    request=rls_pb2.RateLimitRequest(
        domain=DOMAIN,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[Entry(key=k, value="v")], hits_addend={"value": UINT64_MAX}
            )
            for k in ("fw", "log", "swc", "tb", "lb", "gcra", "max", "multi", "shadow")
        ],
    ),
    max_keys=64,
    cached=True,
    shadow=False,
    headers=True,
    later_s=0.5,
)
@example(  # an override of the largest limit in every unit, consumed whole
    request=rls_pb2.RateLimitRequest(
        domain=DOMAIN,
        hits_addend=UINT32_MAX,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[Entry(key="k", value=str(unit))],
                limit={"requests_per_unit": UINT32_MAX, "unit": unit},
            )
            for unit in range(1, 8)
        ],
    ),
    max_keys=3,
    cached=False,
    shadow=True,
    headers=True,
    later_s=0.0,
)
@example(  # an unknown unit number in an override
    request=rls_pb2.RateLimitRequest(
        domain=DOMAIN,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[Entry(key="fw", value="v")], limit={"requests_per_unit": 0, "unit": 99}
            )
        ],
    ),
    max_keys=1,
    cached=False,
    shadow=False,
    headers=False,
    later_s=0.0,
)
def test_every_request_gets_a_decision_or_names_the_bad_field(
    loop: asyncio.AbstractEventLoop,
    request: rls_pb2.RateLimitRequest,
    max_keys: int,
    cached: bool,
    shadow: bool,
    headers: bool,
    later_s: float,
) -> None:
    memory = MemoryBackend(max_keys=max_keys)
    backend = OverLimitCache(memory, max_keys=max_keys) if cached else memory
    clock = ManualClock(START)
    limiter = RateLimiter(
        lambda: SNAPSHOT,
        backend,
        clock,
        LimiterSettings(bounds=BOUNDS, global_shadow_mode=shadow, response_headers=headers),
        recorder=UsageRecorder(),
    )
    field = expected_field(request)
    for _ in range(2):  # twice: the second call meets the state the first one left
        try:
            decision = loop.run_until_complete(
                limiter.should_rate_limit(request_from_proto(request))
            )
        except InvalidRequestError as exc:
            assert field is not None, f"refused a valid request: {exc}"
            assert_names(str(exc), field)
            event("refused: " + re.sub(r"\[\d+\]", "[i]", field))
        else:
            assert field is None, f"accepted a request with a bad {field}"
            assert_well_formed(decision, request, shadow)
            event(f"decided: {decision.overall_code.name}")
        clock.advance(later_s)
    assert len(memory) <= max_keys


# --- over gRPC: the servicer's status codes -------------------------------------------------------


# The gRPC tests run against both transports of the gRPC port (sluice serve --transport).
@pytest.fixture(scope="module", params=["grpcio", "pyvoy"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("fuzz")
    config = workdir / "policy.yaml"
    config.write_text(POLICY)
    args = ["--response-headers", "--memory-max-keys", "1000", "--transport", request.param]
    with sluice_serve(workdir, config=config, extra_args=args) as process:
        yield process
    assert "ShouldRateLimit failed" not in process.log(), process.log()


@pytest.fixture(scope="module")
def channel(server: SluiceProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_target) as ch:
        yield ch


@pytest.mark.slow
@settings(
    max_examples=cases(ci=150, nightly=4000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=requests())
def test_grpc_answers_or_refuses_with_invalid_argument(
    channel: grpc.Channel, request: rls_pb2.RateLimitRequest
) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    field = expected_field(request)
    try:
        response = stub.ShouldRateLimit(request, timeout=10)
    except grpc.RpcError as exc:
        if request.ByteSize() > MAX_RECEIVE_BYTES:
            assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            return
        assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        assert field is not None, f"refused a valid request: {exc.details()}"
        assert_names(exc.details(), field)
    else:
        assert field is None, f"accepted a request with a bad {field}"
        assert request.ByteSize() <= MAX_RECEIVE_BYTES
        assert len(response.statuses) == len(request.descriptors)
        assert response.overall_code in (
            rls_pb2.RateLimitResponse.OK,
            rls_pb2.RateLimitResponse.OVER_LIMIT,
        )


def test_a_request_over_the_message_size_is_resource_exhausted(channel: grpc.Channel) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    big = ratelimit_pb2.RateLimitDescriptor(
        entries=[Entry(key="fw", value="x" * (5 * 1024 * 1024))]
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain=DOMAIN, descriptors=[big]), timeout=10)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_server_answers(channel)


# --- raw bytes as the request message -------------------------------------------------------------

VALID = rls_pb2.RateLimitRequest(
    domain=DOMAIN,
    hits_addend=1,
    descriptors=[
        ratelimit_pb2.RateLimitDescriptor(
            entries=[Entry(key="deep", value="a"), Entry(key="fw", value="b")],
            limit={"requests_per_unit": 7, "unit": 2},
            hits_addend={"value": 2},
        )
    ],
).SerializeToString()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid request's bytes with some flipped, inserted, deleted or cut off."""
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        operation = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if operation == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif operation == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif operation == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        else:
            del data[at:]
    return bytes(data)


def assert_server_answers(channel: grpc.Channel) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    response = stub.ShouldRateLimit(rls_pb2.RateLimitRequest.FromString(VALID), timeout=10)
    assert len(response.statuses) == 1


@settings(max_examples=cases(ci=150, nightly=4000), deadline=None)
@given(data=st.one_of(st.binary(max_size=200), mutated()))
@example(data=b"\x0a")  # a length-delimited field cut off before its length
@example(data=b"\x0a\xff\xff\xff\xff\x0f")  # a length far past the end
@example(data=b"\x0a\x02\xff\xfe")  # a domain that is not UTF-8
@example(data=b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01")  # an 11-byte varint
@example(data=b"\x0b" * 200)  # unknown groups nested 200 deep
@example(data=b"\x12" + b"\x80\x80\x80\x80\x08")  # a descriptor of 2 GiB
def test_raw_bytes_never_take_the_server_down(
    server: SluiceProcess, channel: grpc.Channel, data: bytes
) -> None:
    call = channel.unary_unary(
        RLS_METHOD,
        request_serializer=None,  # the bytes go on the wire as they are
        response_deserializer=rls_pb2.RateLimitResponse.FromString,
    )
    try:
        call(data, timeout=10)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details()
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        if details.startswith("request: "):
            assert NOT_PROTOBUF.fullmatch(details), details
        else:  # the bytes parsed, and the request is out of bounds
            assert_names(details, details.split(":")[0])
        event("refused: " + re.sub(r"\[\d+\]", "[i]", details.split(":")[0]))
    else:
        event("decided")
    assert_server_answers(channel)
    assert server.process.poll() is None
