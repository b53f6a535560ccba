"""quota_mode decided as envoyproxy/ratelimit decides it: the real Go binary (as
tests/integration/test_migrate_counters.py runs it) and ``sluice serve``, each on the same
YAML and the same sequence of requests, give the same answers (overall code, and each
descriptor's code and remaining count)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tests.integration.test_migrate_counters import go_ratelimit, not_at_a_day_boundary
from tests.support.processes import sluice_serve
from tests.support.redis_servers import RedisProcess

CONFIG = """\
domain: q
descriptors:
  - {key: quota, quota_mode: true, rate_limit: {unit: day, requests_per_unit: 1}}
  - {key: quota2, quota_mode: true, rate_limit: {unit: day, requests_per_unit: 1}}
  - {key: plain, rate_limit: {unit: day, requests_per_unit: 2}}
  - {key: free, quota_mode: true, rate_limit: {unlimited: true}}
  - key: shadow
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
"""
# Requests, each a list of single-entry descriptors; values name fresh counters per case.
REQUESTS: list[list[tuple[str, str]]] = [
    [("quota", "a")],
    [("quota", "a")],  # the only quota, spent: refused
    [("quota", "a"), ("quota2", "b")],  # a spent, b has room: OK, a's status still over
    [("quota", "a"), ("quota2", "b")],  # both spent: refused
    [("quota", "a"), ("plain", "c")],  # the only quota spent, beside an ordinary limit
    [("quota", "d"), ("plain", "c")],
    [("quota", "d"), ("plain", "c")],  # the ordinary limit over too
    [("quota", "a"), ("free", "x")],  # an unlimited rule is no quota
    [("quota", "e"), ("shadow", "s")],
    [("quota", "e"), ("shadow", "s")],  # a shadow quota is never over
    [("quota", "f"), ("quota2", "f"), ("plain", "f")],
    [("quota", "f"), ("quota2", "g"), ("plain", "g")],
    [("nothing", "n"), ("quota", "f")],  # a descriptor no rule matches, and a spent quota
]

Answer = tuple[int, list[tuple[int, int]]]


def answers(target: str) -> list[Answer]:
    out = []
    with grpc.insecure_channel(target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for descriptors in REQUESTS:
            request = rls_pb2.RateLimitRequest(domain="q")
            for key, value in descriptors:
                request.descriptors.add().entries.add(key=key, value=value)
            response = stub.ShouldRateLimit(request, timeout=10)
            statuses = [(int(s.code), s.limit_remaining) for s in response.statuses]
            out.append((int(response.overall_code), statuses))
    return out


@pytest.mark.slow
def test_quota_mode_answers_are_envoyproxy_ratelimits(
    tmp_path: Path, private_redis: RedisProcess
) -> None:
    config = tmp_path / "runtime" / "ratelimit" / "config"
    config.mkdir(parents=True)
    (config / "config.yaml").write_text(CONFIG)
    env = {
        "RUNTIME_ROOT": str(tmp_path / "runtime"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_APPDIRECTORY": "config",
        "RUNTIME_WATCH_ROOT": "false",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": private_redis.url.removeprefix("redis://").split("/")[0],
        "USE_STATSD": "false",
    }
    not_at_a_day_boundary()  # both runs in one day window
    with go_ratelimit(tmp_path, env) as target:
        theirs = answers(target)
    private_redis.client().flushall()  # Sluice starts from the same empty counters
    with sluice_serve(tmp_path, upstream_only=True, env=env) as server:
        ours = answers(server.grpc_target)
    OK, OVER = 1, 2
    assert theirs[1][0] == OVER and theirs[2] == (OK, [(OVER, 0), (OK, 0)])  # as documented
    assert ours == theirs
