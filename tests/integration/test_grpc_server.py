"""A real `sluice serve` on free ports, called through real gRPC channels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tests.support.processes import SluiceProcess, sluice_serve

POLICY = """
domain: grpc-test
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
"""

Entry = ratelimit_pb2.RateLimitDescriptor.Entry


def descriptor(*entries: tuple[str, str], **kwargs: object) -> ratelimit_pb2.RateLimitDescriptor:
    return ratelimit_pb2.RateLimitDescriptor(
        entries=[Entry(key=k, value=v) for k, v in entries],
        **kwargs,  # type: ignore[arg-type]
    )


# Every test here runs against both transports of the gRPC port (sluice serve --transport).
TRANSPORTS = ["grpcio", "pyvoy"]


@pytest.fixture(scope="module", params=TRANSPORTS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("grpc")
    config = workdir / "policy.yaml"
    config.write_text(POLICY)
    args = ["--max-descriptors", "4", "--transport", request.param]
    with sluice_serve(workdir, config=config, extra_args=args) as process:
        yield process


@pytest.fixture(scope="module")
def channel(server: SluiceProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_target) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> rls_pb2_grpc.RateLimitServiceStub:
    return rls_pb2_grpc.RateLimitServiceStub(channel)


def test_decisions_over_grpc(stub: rls_pb2_grpc.RateLimitServiceStub) -> None:
    request = rls_pb2.RateLimitRequest(domain="grpc-test", descriptors=[descriptor(("user", "a"))])
    first = stub.ShouldRateLimit(request, timeout=5)
    assert first.overall_code == rls_pb2.RateLimitResponse.OK
    [status] = first.statuses
    assert status.current_limit.requests_per_unit == 2
    assert status.current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.HOUR
    assert status.limit_remaining == 1
    assert 0 < status.duration_until_reset.seconds <= 3600
    stub.ShouldRateLimit(request, timeout=5)
    third = stub.ShouldRateLimit(request, timeout=5)
    assert third.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    assert third.statuses[0].code == rls_pb2.RateLimitResponse.OVER_LIMIT


def test_unmatched_descriptor_is_ok_without_a_limit(
    stub: rls_pb2_grpc.RateLimitServiceStub,
) -> None:
    response = stub.ShouldRateLimit(
        rls_pb2.RateLimitRequest(domain="elsewhere", descriptors=[descriptor(("user", "a"))]),
        timeout=5,
    )
    assert response.overall_code == rls_pb2.RateLimitResponse.OK
    assert not response.statuses[0].HasField("current_limit")


def test_descriptor_hits_addend_and_override_travel_over_the_wire(
    stub: rls_pb2_grpc.RateLimitServiceStub,
) -> None:
    override = ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
        requests_per_unit=10, unit=rls_pb2.RateLimitResponse.RateLimit.DAY
    )
    request = rls_pb2.RateLimitRequest(
        domain="grpc-test",
        descriptors=[descriptor(("user", "override"), limit=override, hits_addend={"value": 4})],
    )
    status = stub.ShouldRateLimit(request, timeout=5).statuses[0]
    assert status.current_limit.requests_per_unit == 10
    assert status.current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.DAY
    assert status.limit_remaining == 6


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            rls_pb2.RateLimitRequest(descriptors=[descriptor(("k", "v"))]),
            "domain: must not be empty",
        ),
        (rls_pb2.RateLimitRequest(domain="d"), "descriptors: must not be empty"),
        (
            rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor()]),
            "descriptors[0].entries: must not be empty",
        ),
        (
            rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor(("", "v"))]),
            "descriptors[0].entries[0].key: must not be empty",
        ),
        (
            rls_pb2.RateLimitRequest(
                domain="d",
                descriptors=[
                    descriptor(
                        ("k", "v"),
                        limit=ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
                            requests_per_unit=1
                        ),
                    )
                ],
            ),
            "descriptors[0].limit.unit: must be one of "
            "SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR",
        ),
        (
            rls_pb2.RateLimitRequest(domain="d" * 257, descriptors=[descriptor(("k", "v"))]),
            "domain: 257 characters, more than the maximum of 256",
        ),
        (
            rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor(("k", "v"))] * 5),
            "descriptors: 5 descriptors, more than the maximum of 4",
        ),
        (
            rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor(*[("k", "v")] * 17)]),
            "descriptors[0].entries: 17 entries, more than the maximum of 16",
        ),
        (
            rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor(("k" * 257, "v"))]),
            "descriptors[0].entries[0].key: 257 characters, more than the maximum of 256",
        ),
        (
            rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor(("k", "v" * 1025))]),
            "descriptors[0].entries[0].value: 1025 characters, more than the maximum of 1024",
        ),
    ],
)
def test_bad_requests_get_invalid_argument_naming_the_field(
    stub: rls_pb2_grpc.RateLimitServiceStub, request_: rls_pb2.RateLimitRequest, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ShouldRateLimit(request_, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == message


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x0a\xff\xff\xff\xff\x0f", "Wire format was corrupt"),  # a length past the end
        (b"\x0a\x02\xff\xfe", "String field had bad UTF-8"),  # the domain
    ],
)
def test_bytes_that_are_not_a_request_get_invalid_argument(
    channel: grpc.Channel, data: bytes, reason: str
) -> None:
    call = channel.unary_unary(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        request_serializer=None,  # the bytes go on the wire as they are
        response_deserializer=rls_pb2.RateLimitResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as info:
        call(data, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "request: not a RateLimitRequest in protobuf's wire format: Error parsing message "
        f"with type 'envoy.service.ratelimit.v3.RateLimitRequest': {reason}"
    )


@pytest.mark.parametrize("service", ["", "ratelimit"])
def test_health_service(channel: grpc.Channel, service: str) -> None:
    response = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5
    )
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_and_describes_the_service(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {
        "envoy.service.ratelimit.v3.RateLimitService",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
        "grpc.health.v1.Health",
    } <= services
    file = database.FindFileContainingSymbol("envoy.service.ratelimit.v3.RateLimitService")
    assert file.name == "envoy/service/ratelimit/v3/rls.proto"
    assert [m.name for m in file.service[0].method] == ["ShouldRateLimit"]


def _reports(*messages: rlqs_pb2.RateLimitQuotaUsageReports) -> Iterator[object]:
    yield from messages


def _report(domain: str, **bucket: str) -> rlqs_pb2.RateLimitQuotaUsageReports:
    message = rlqs_pb2.RateLimitQuotaUsageReports(domain=domain)
    message.bucket_quota_usages.add().bucket_id.bucket.update(bucket)
    return message


def test_rlqs_stream_assigns_the_rules_token_bucket(channel: grpc.Channel) -> None:
    stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel)
    responses = stub.StreamRateLimitQuotas(_reports(_report("grpc-test", user="a")), timeout=10)
    [response] = list(responses)  # the client closes its side: so does Sluice
    [action] = response.bucket_action
    assert dict(action.bucket_id.bucket) == {"user": "a"}
    assignment = action.quota_assignment_action
    assert assignment.assignment_time_to_live.seconds == 15
    bucket = assignment.rate_limit_strategy.token_bucket
    # 2 an hour: one token every 1800 s, two of capacity.
    assert (bucket.max_tokens, bucket.tokens_per_fill.value) == (2, 1)
    assert bucket.fill_interval.seconds == 1800


def test_rlqs_bad_report_ends_the_stream_with_invalid_argument(channel: grpc.Channel) -> None:
    stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel)
    responses = stub.StreamRateLimitQuotas(_reports(_report("", user="a")), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        list(responses)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "domain: the stream's first report must name the policy domain" in str(
        caught.value.details()
    )


def test_rlqs_bytes_that_are_not_a_report_are_refused_naming_the_request(
    channel: grpc.Channel,
) -> None:
    stream = channel.stream_stream(
        "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
        request_serializer=lambda raw: raw,
        response_deserializer=lambda raw: raw,
    )
    with pytest.raises(grpc.RpcError) as caught:
        list(stream(iter([b"\xff\xff\xff"]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request: not a RateLimitQuotaUsageReports in protobuf's wire format" in str(
        caught.value.details()
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigterm_stops_the_server_cleanly(tmp_path: Path, transport: str) -> None:
    with sluice_serve(tmp_path, extra_args=["--transport", transport]) as process:
        assert process.terminate() == 0
        assert "stopped" in process.log()
