"""The pure parts shared by both clients: request building, response reading, failure
choices, acquire()'s steps and the HTTP headers. No server, no I/O."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from sluice_client import (
    Client,
    Decision,
    Descriptor,
    DescriptorDecision,
    InvalidRequest,
    Limit,
    RateLimited,
    SluiceUnavailable,
    rate_limit_headers,
)
from sluice_client._acquire import MIN_RETRY_WAIT_S, Step, next_step
from sluice_client._channel import channel_config
from sluice_client._proto.envoy.service.ratelimit.v3 import rls_pb2
from sluice_client._wire import build_request, decision_from_error, parse_response

# Requests.


def test_mapping_items_are_entries_in_order() -> None:
    request = build_request("d", [{"b": "2", "a": "1"}, {"user": "u"}], hits=3)
    assert request.domain == "d" and request.hits_addend == 3
    entries = [[(e.key, e.value) for e in d.entries] for d in request.descriptors]
    assert entries == [[("b", "2"), ("a", "1")], [("user", "u")]]
    assert not request.descriptors[0].HasField("hits_addend")
    assert not request.descriptors[0].HasField("limit")


def test_descriptor_hits_and_override() -> None:
    request = build_request(
        "d",
        [
            Descriptor({"k": "v"}, hits=0),
            Descriptor([("k", "v"), ("x", "y")], limit=Limit(5, "hour")),
        ],
        hits=1,
    )
    peek, override = request.descriptors
    assert peek.HasField("hits_addend") and peek.hits_addend.value == 0
    assert (override.limit.requests_per_unit, override.limit.unit) == (5, 3)
    assert Descriptor({"k": "v"}).entries == (("k", "v"),)  # normalised, hashable
    assert hash(Descriptor({"k": "v"})) == hash(Descriptor([("k", "v")]))


@pytest.mark.parametrize(
    ("domain", "descriptors", "hits", "message"),
    [
        ("", [{"k": "v"}], 1, "domain: must be a non-empty string"),
        ("d", {"k": "v"}, 1, "descriptors: must be a list"),
        ("d", [], 1, "descriptors: must not be empty"),
        ("d", [{}], 1, r"descriptors\[0\]: must have at least one entry"),
        ("d", [{"k": "v"}, {"": "v"}], 1, r"descriptors\[1\].entries\[0\].key"),
        ("d", [{"k": 7}], 1, r"descriptors\[0\].entries\[0\].value: must be a string"),
        ("d", [{"k": "v"}], 0, "use Descriptor"),
        ("d", [Descriptor({"k": "v"}, hits=-1)], 1, r"descriptors\[0\].hits"),
        ("d", [Descriptor({"k": "v"}, limit=Limit(1, "week"))], 1, "limit.unit: must be one of"),
        ("d", ["k=v"], 1, r"descriptors\[0\]: must be a mapping or a Descriptor"),
    ],
)
def test_malformed_requests_name_the_field(
    domain: str, descriptors: object, hits: int, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        build_request(domain, descriptors, hits=hits)  # type: ignore[arg-type]


# Responses.


def _response(**metadata: object) -> rls_pb2.RateLimitResponse:
    response = rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OVER_LIMIT)
    ok = response.statuses.add(code=rls_pb2.RateLimitResponse.OK, limit_remaining=3)
    ok.current_limit.requests_per_unit = 2
    ok.current_limit.unit = rls_pb2.RateLimitResponse.RateLimit.WEEK
    ok.current_limit.name = "shaped"
    ok.duration_until_reset.seconds = 1
    ok.duration_until_reset.nanos = 250_000_000
    over = response.statuses.add(code=rls_pb2.RateLimitResponse.OVER_LIMIT)
    over.current_limit.requests_per_unit = 0
    over.current_limit.unit = rls_pb2.RateLimitResponse.RateLimit.SECOND
    for key, value in metadata.items():
        response.dynamic_metadata[key] = value
    response.response_headers_to_add.add(key="Retry-After", value="1")
    return response


def test_statuses_limits_durations_and_sluice_metadata() -> None:
    decision = parse_response(
        _response(sluice_delay_s=[0.5, 0], sluice_reasons=["", "the limit is 0"])
    )
    assert not decision.allowed and not decision.degraded
    shaped, blocked = decision.statuses
    assert shaped == DescriptorDecision(
        allowed=True, limit=Limit(2, "week", "shaped"), remaining=3, reset_s=1.25, delay_s=0.5
    )
    assert shaped.limit is not None and shaped.limit.window_s == 7 * 24 * 3600
    assert blocked.reason == "the limit is 0" and blocked.retry_after_s is None
    assert decision.retry_after_s is None  # one refused descriptor never fits
    assert decision.headers == (("Retry-After", "1"),)


@pytest.mark.parametrize(
    "metadata",
    [{}, {"sluice_delay_s": "soon"}, {"sluice_delay_s": ["x", 1]}, {"sluice_reasons": [1, 2]}],
)
def test_absent_or_foreign_metadata_is_ignored(metadata: dict[str, object]) -> None:
    decision = parse_response(_response(**metadata))
    assert [s.delay_s for s in decision.statuses] == [0.0, 0.0]
    assert [s.reason for s in decision.statuses] == ["", ""]


def test_aggregates() -> None:
    refused = Decision(
        allowed=False,
        statuses=(
            DescriptorDecision(allowed=False, reset_s=3.0),
            DescriptorDecision(allowed=False, reset_s=7.5),
            DescriptorDecision(allowed=True, reset_s=60.0, delay_s=2.0),
        ),
    )
    assert refused.retry_after_s == 7.5 and refused.delay_s == 0.0
    allowed = Decision(
        allowed=True,
        statuses=(DescriptorDecision(allowed=True, delay_s=0.25), DescriptorDecision(True)),
    )
    assert allowed.retry_after_s is None and allowed.delay_s == 0.25


# Failure choices.


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "details"


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL],
)
def test_no_decision_follows_on_unavailable(code: grpc.StatusCode) -> None:
    error = FakeRpcError(code)
    allowed = decision_from_error(error, descriptor_count=2, on_unavailable="allow")
    denied = decision_from_error(error, descriptor_count=2, on_unavailable="deny")
    assert allowed.allowed and allowed.degraded and len(allowed.statuses) == 2
    assert not denied.allowed and denied.degraded
    assert denied.statuses[0].reason == f"Sluice unavailable ({code.name})"
    with pytest.raises(SluiceUnavailable) as caught:
        decision_from_error(error, descriptor_count=2, on_unavailable="raise")
    assert caught.value.code is code


def test_invalid_argument_always_raises() -> None:
    with pytest.raises(InvalidRequest, match="details"):
        decision_from_error(
            FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT),
            descriptor_count=1,
            on_unavailable="allow",
        )


# acquire()'s steps.


def _allowed(delay_s: float = 0.0) -> Decision:
    return Decision(allowed=True, statuses=(DescriptorDecision(allowed=True, delay_s=delay_s),))


def _refused(reset_s: float, reason: str = "") -> Decision:
    status = DescriptorDecision(allowed=False, reset_s=reset_s, reason=reason)
    return Decision(allowed=False, statuses=(status,))


def test_acquire_steps() -> None:
    assert next_step(_allowed(), budget_s=1, max_wait_s=1) == Step(0.0, done=True)
    assert next_step(_allowed(0.4), budget_s=1, max_wait_s=1) == Step(0.4, done=True)
    assert next_step(_refused(0.7), budget_s=1, max_wait_s=1) == Step(0.7, done=False)
    # A reported reset of 0 must not make acquire() spin.
    assert next_step(_refused(0.0), budget_s=1, max_wait_s=1) == Step(MIN_RETRY_WAIT_S, False)
    with pytest.raises(RateLimited, match="longer than the 1s max_wait_s"):
        next_step(_allowed(1.5), budget_s=1, max_wait_s=1)
    with pytest.raises(RateLimited, match="beyond the 1s max_wait_s") as caught:
        next_step(_refused(2.0), budget_s=1, max_wait_s=1)
    assert caught.value.decision.retry_after_s == 2.0
    with pytest.raises(RateLimited, match="can never"):
        next_step(_refused(0, reason="can never be admitted"), budget_s=9, max_wait_s=9)


# HTTP headers derived without the server's.


def test_headers_for_the_limit_closest_to_exhaustion() -> None:
    decision = Decision(
        allowed=False,
        statuses=(
            DescriptorDecision(allowed=True, limit=Limit(100, "hour", "big"), remaining=50),
            DescriptorDecision(
                allowed=False, limit=Limit(10, "minute", 'we"ird\u00e9'), remaining=0, reset_s=2.1
            ),
        ),
    )
    assert rate_limit_headers(decision) == (
        ("RateLimit-Policy", '"we\\"ird?";q=10;w=60'),
        ("RateLimit", '"we\\"ird?";r=0;t=3'),
        ("Retry-After", "3"),
    )
    unnamed = Decision(True, (DescriptorDecision(True, Limit(5, "second"), 4, 0.5),))
    assert rate_limit_headers(unnamed) == (
        ("RateLimit-Policy", '"default";q=5;w=1'),
        ("RateLimit", '"default";r=4;t=1'),
    )
    assert rate_limit_headers(Decision(True, (DescriptorDecision(True),))) == ()


# Channel settings.


def test_channel_config(tmp_path: Path) -> None:
    plain = channel_config(
        "h:1",
        credentials=None,
        tls=False,
        root_certificates=None,
        certificate_chain=None,
        private_key=None,
        options=[("grpc.keepalive_time_ms", 1000)],
    )
    assert plain.credentials is None
    assert plain.options == (
        ("grpc.max_reconnect_backoff_ms", 5000),
        ("grpc.service_config", '{"loadBalancingConfig": [{"round_robin": {}}]}'),
        ("grpc.keepalive_time_ms", 1000),
    )
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"not checked until the channel connects")
    secure = channel_config(
        "h:1",
        credentials=None,
        tls=False,
        root_certificates=ca,
        certificate_chain=None,
        private_key=None,
        options=[("grpc.max_reconnect_backoff_ms", 100)],  # the caller's value wins
    )
    assert isinstance(secure.credentials, grpc.ChannelCredentials)
    assert dict(secure.options)["grpc.max_reconnect_backoff_ms"] == 100


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"target": ""}, "target"),
        ({"credentials": grpc.ssl_channel_credentials(), "root_certificates": b"x"}, "either"),
        ({"certificate_chain": b"cert"}, "both certificate_chain and private_key"),
    ],
)
def test_channel_config_refuses_contradictions(overrides: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {
        "target": "h:1",
        "credentials": None,
        "tls": False,
        "root_certificates": None,
        "certificate_chain": None,
        "private_key": None,
        "options": (),
    }
    arguments.update(overrides)
    target = arguments.pop("target")
    with pytest.raises(ValueError, match=message):
        channel_config(target, **arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout_s", [0, -1, True, "1"])
def test_timeouts_must_be_positive_numbers(timeout_s: object) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        Client("h:1", timeout_s=timeout_s)  # type: ignore[arg-type]


def test_on_unavailable_must_be_a_known_choice() -> None:
    with pytest.raises(ValueError, match="on_unavailable must be one of"):
        Client("h:1", on_unavailable="ignore")  # type: ignore[arg-type]
