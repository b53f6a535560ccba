"""The sampled access log of decisions in a real ``sluice serve``, on both transports: with
``--access-log-sample-rate 1`` at DEBUG every call is a line naming the domain, the
descriptors, the overall code and the caller's address; at INFO there is none."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tests.support.processes import sluice_serve

POLICY = """\
domain: logged
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
"""
LINE = re.compile(
    r"DEBUG sluice\.access: decision domain=logged descriptors=\[user=ada\] "
    r"overall_code=(\w+) duration_ms=[0-9.]+ peer=ipv4:127\.0\.0\.1:\d+$",
    re.M,
)


def _ask_twice(target: str) -> None:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value="ada")
    request = rls_pb2.RateLimitRequest(
        domain="logged", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )
    with grpc.insecure_channel(target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for _ in range(2):
            stub.ShouldRateLimit(request, timeout=5)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["grpcio", "pyvoy"])
@pytest.mark.parametrize("level", ["DEBUG", "INFO"])
def test_every_sampled_decision_is_a_debug_line(tmp_path: Path, transport: str, level: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    args = ["--transport", transport, "--log-level", level, "--access-log-sample-rate", "1"]
    with sluice_serve(tmp_path, config=policy, extra_args=args) as server:
        _ask_twice(server.grpc_target)
    codes = LINE.findall(server.log())
    assert codes == (["OK", "OVER_LIMIT"] if level == "DEBUG" else [])
