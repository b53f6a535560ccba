"""Hostile wildcard values against a real `sluice serve`: every request is answered quickly
and the server stays responsive.

Wildcards were once matched with a backtracking regular expression: one request carrying a
1 KiB value of ``a``s against a published ``*a*a*a*a*b`` froze both ports for good. The policy
here is built to make matching as expensive as validation lets it be: 16 levels deep, each
level holding patterns with the maximum of 16 stars that scan the whole value before failing
(long runs of the same character, near misses at the end, a piece that fails only at its
last character), then a 16-star pattern that does match, so the walk goes one level deeper.
A request of 64 descriptors of 16 entries of 1 KiB makes 64 × 16 × 8 matches of 1 KiB.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.policies.glob import MAX_WILDCARDS, Glob
from tests.support.processes import SluiceProcess, sluice_serve

DEPTH = 16
VALUE = "a" * 1024

# Each fails against VALUE only after scanning it; each has MAX_WILDCARDS stars.
FAILING = [
    "*" + "*".join(["a" * 70] * (MAX_WILDCARDS - 1)) + "*",  # 15 × 70 > 1024: runs out at the end
    "*" + "*".join(["a" * 63 + "b"] * (MAX_WILDCARDS - 1)) + "*",  # fails at a piece's last char
    "*a" * (MAX_WILDCARDS - 1) + "*b",  # the original attack, with the maximum of stars
    "a*" * (MAX_WILDCARDS - 1) + "*" + "a" * 900 + "b",
    "*".join(["a"] * (MAX_WILDCARDS + 1)) + "b",
    "*" * MAX_WILDCARDS + "a" * 1025,
    "*b" + "*a" * (MAX_WILDCARDS - 1),
]
MATCHING = "*" + "*".join(["a" * 60] * (MAX_WILDCARDS - 1)) + "*"  # 900 of 1024: matches


def rule(pattern: str, requests_per_unit: int) -> str:
    limit = f"{{unit: second, requests_per_unit: {requests_per_unit}}}"
    return f"{{key: k, value: '{pattern}', rate_limit: {limit}}}"


def policy() -> str:
    """The nested rule tree, as YAML in flow style (one line per level)."""
    node = rule(MATCHING, 1_000_000)
    for _ in range(DEPTH - 1):
        failing = ", ".join(rule(pattern, 1) for pattern in FAILING)
        node = f"{{key: k, value: '{MATCHING}', descriptors: [{failing}, {node}]}}"
    failing = ", ".join(f"{{key: k, value: '{pattern}'}}" for pattern in FAILING)
    return f"domain: wild\ndescriptors: [{failing}, {node}]\n"


def assert_patterns_are_hostile() -> None:
    for pattern in FAILING:
        assert pattern.count("*") == MAX_WILDCARDS, pattern
        assert not Glob(pattern).matches(VALUE), pattern
    assert MATCHING.count("*") == MAX_WILDCARDS
    assert Glob(MATCHING).matches(VALUE)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    assert_patterns_are_hostile()
    workdir = tmp_path_factory.mktemp("wildcard-abuse")
    (workdir / "policy.yaml").write_text(policy())
    with sluice_serve(workdir, config=workdir / "policy.yaml") as process:
        yield process


def deepest_request() -> rls_pb2.RateLimitRequest:
    Entry = ratelimit_pb2.RateLimitDescriptor.Entry
    descriptor = ratelimit_pb2.RateLimitDescriptor(
        entries=[Entry(key="k", value=VALUE) for _ in range(DEPTH)]
    )
    return rls_pb2.RateLimitRequest(domain="wild", descriptors=[descriptor] * 64)


def healthy(server: SluiceProcess) -> float:
    """Seconds /healthcheck took to answer 200."""
    started = time.perf_counter()
    with urllib.request.urlopen(server.http_url + "/healthcheck", timeout=5) as response:
        assert response.status == 200
    return time.perf_counter() - started


# The stated bound. On the 2-core development machine the heaviest request (64 × 16 entries
# of 1 KiB, 8 patterns tried per entry) is answered in about 25 ms (17 ms of it matching);
# the bound leaves room for a loaded CI machine. With the regular expression, one such entry
# took over a minute.
ANSWER_WITHIN_S = 2.0


def test_the_heaviest_request_is_answered_within_the_bound(server: SluiceProcess) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for _ in range(5):
            started = time.perf_counter()
            response = stub.ShouldRateLimit(deepest_request(), timeout=10)
            elapsed = time.perf_counter() - started
            assert response.overall_code == rls_pb2.RateLimitResponse.OK
            assert len(response.statuses) == 64
            # The matching leaf's limit, so the walk really went 16 levels deep.
            assert response.statuses[0].current_limit.requests_per_unit == 1_000_000
            assert elapsed < ANSWER_WITHIN_S, f"{elapsed:.3f}s"


def test_json_attack_leaves_the_health_check_answering(server: SluiceProcess) -> None:
    # The reported attack: /json, values of 1 KiB, against the wildcard rules (one level, as
    # the body limit of 64 KiB allows about 60 such values).
    body = json.dumps(
        {"domain": "wild", "descriptors": [{"entries": [{"key": "k", "value": VALUE}]}] * 60}
    ).encode()
    stop = threading.Event()
    answered: list[float] = []
    failures: list[BaseException] = []

    def attack() -> None:
        while not stop.is_set():
            request = urllib.request.Request(
                server.http_url + "/json", data=body, headers={"Content-Type": "application/json"}
            )
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
                answered.append(time.perf_counter() - started)
            except Exception as exc:  # the assertion below reports it
                failures.append(exc)
                return

    attackers = [threading.Thread(target=attack) for _ in range(8)]
    for thread in attackers:
        thread.start()
    try:
        health = [healthy(server) for _ in range(20)]
    finally:
        stop.set()
        for thread in attackers:
            thread.join()
    assert not failures, failures
    assert answered, "no attack request was answered"
    assert max(answered) < ANSWER_WITHIN_S, f"slowest /json answer: {max(answered):.3f}s"
    assert max(health) < ANSWER_WITHIN_S, f"slowest /healthcheck: {max(health):.3f}s"
