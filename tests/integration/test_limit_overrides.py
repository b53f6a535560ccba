"""Client limit overrides against a real `sluice serve --limit-overrides ignore`: a client
cannot raise its own limit, and a domain that denies overrides says which field is refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tests.support.processes import SluiceProcess, sluice_serve

POLICY = """
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
---
domain: strict
limit_overrides: deny
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
"""
RAISED = {"requests_per_unit": 1_000_000, "unit": "MINUTE"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("limit-overrides")
    (workdir / "policy.yaml").write_text(POLICY)
    with sluice_serve(
        workdir, config=workdir / "policy.yaml", extra_args=["--limit-overrides", "ignore"]
    ) as process:
        yield process


def post(server: SluiceProcess, domain: str, user: str) -> tuple[int, dict]:
    body = {"domain": domain, "descriptors": [{"entries": [{"key": "user", "value": user}]}]}
    body["descriptors"][0]["limit"] = RAISED
    request = urllib.request.Request(
        server.http_url + "/json",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_bob_cannot_raise_his_own_limit(server: SluiceProcess) -> None:
    answers = [post(server, "api", "bob") for _ in range(6)]
    assert [status for status, _ in answers] == [200] * 5 + [429]
    remaining = [body["statuses"][0].get("limitRemaining", 0) for _, body in answers]
    assert remaining == [4, 3, 2, 1, 0, 0]
    assert all(body["statuses"][0]["currentLimit"]["requestsPerUnit"] == 5 for _, body in answers)


def test_a_denying_domain_names_the_field(server: SluiceProcess) -> None:
    assert post(server, "strict", "bob") == (
        400,
        {
            "error": "descriptors[0].limit: domain 'strict' does not accept limit overrides from "
            "clients"
        },
    )
    request = rls_pb2.RateLimitRequest(
        domain="strict",
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value="bob")],
                limit=ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
                    requests_per_unit=1_000_000, unit=2
                ),
            )
        ],
    )
    with grpc.insecure_channel(server.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as info:
            rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=5)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "descriptors[0].limit: domain 'strict' does not accept limit overrides from clients"
    )
