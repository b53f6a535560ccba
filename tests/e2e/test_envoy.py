"""End to end: a real Envoy runs examples/envoy/envoy.yaml against `sluice serve` with
examples/envoy/ratelimit.yaml; only the ports are rewritten.

Envoy fails open (failure_mode_deny: false): if Sluice errs or is unreachable every request
simply passes. So each scenario also checks Envoy's own counters: ``ratelimit.error`` and
``ratelimit.failure_mode_allowed`` must stay 0 and ``ratelimit.ok``/``ratelimit.over_limit``
must move by exactly what the scenario caused. The counters are read before the response
codes, so an RLS failure is reported as such rather than as a missing 429.

Every limit is per hour (fixed windows aligned to the Unix epoch, on the same clock as
this test); each scenario uses its own descriptor values so that none depends on another's
counts. A scenario lasts milliseconds, so crossing an hour boundary is very unlikely; if it
happens, ``_one_window`` says so plainly instead of leaving a puzzling count mismatch.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.envoy import (
    EnvoyProcess,
    Response,
    envoy_binary,
    envoy_serve,
    http_get,
)
from tests.support.envoy_example import (
    ENVOY_CONFIG,
    POLICY,
    STATS,
    UPSTREAM_BODY,
    example_config,
    upstream_server,
)
from tests.support.processes import SluiceProcess, free_port, sluice_serve

pytestmark = pytest.mark.e2e

HOUR_S = 3600


@dataclass
class Stack:
    envoy: EnvoyProcess
    sluice: SluiceProcess
    port: int  # Envoy's listener

    def get(self, path: str, headers: dict[str, str] | None = None) -> Response:
        return http_get(self.port, path, headers)

    def counters(self) -> dict[str, int]:
        return {
            name.removeprefix(STATS): value
            for name, value in self.envoy.counters(r"ratelimit").items()
            if name.startswith(STATS)
        }

    def diagnostics(self) -> str:
        return f"--- envoy log ---\n{self.envoy.log()}\n--- sluice log ---\n{self.sluice.log()}"


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    with upstream_server() as port:
        yield port


# Envoy's ratelimit filter against both transports of Sluice's gRPC port.
@pytest.fixture(scope="module", params=["grpcio", "pyvoy"])
def stack(
    upstream: int, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    try:
        envoy_binary()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))  # never a skip: a missing Envoy must not pass as green
    workdir = tmp_path_factory.mktemp("envoy-e2e")
    transport = ["--transport", request.param]
    with sluice_serve(workdir, config=POLICY, extra_args=transport) as sluice:
        listener, admin = free_port(), free_port()
        config = example_config(
            ENVOY_CONFIG,
            listener=listener,
            admin=admin,
            upstream=upstream,
            sluice=sluice.grpc_port,
        )
        with envoy_serve(workdir, config, admin_port=admin, listener_ports=(listener,)) as envoy:
            yield Stack(envoy, sluice, listener)


@contextlib.contextmanager
def _one_window() -> Iterator[None]:
    """Fail (never skip) if the requests inside may have straddled an hourly window."""
    start = time.time() // HOUR_S
    yield
    if time.time() // HOUR_S != start:
        pytest.fail("an hourly rate-limit window ended during this scenario; just rerun it")


def _check_rls(stack: Stack, before: dict[str, int], *, ok: int, over_limit: int) -> None:
    """Every request reached Sluice and got a real answer: no error, no fail-open."""
    after = stack.counters()
    failures = {k: after.get(k, 0) for k in ("error", "failure_mode_allowed")}
    assert failures == {"error": 0, "failure_mode_allowed": 0}, (
        f"Envoy could not get answers from Sluice (it fails open): {after}\n{stack.diagnostics()}"
    )
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in ("ok", "over_limit")}
    assert moved == {"ok": ok, "over_limit": over_limit}, f"{before} -> {after}"


def _limit_header(response: Response) -> int:
    """The quota of DRAFT_VERSION_03's ``x-ratelimit-limit: 3, 3;w=3600``."""
    value = response.headers["x-ratelimit-limit"]
    quota, _, policy = value.partition(",")
    assert f"{quota.strip()};w={HOUR_S}" in policy.replace(" ", ""), value
    return int(quota)


def _assert_allowed(response: Response) -> None:
    assert (response.status, response.body) == (200, UPSTREAM_BODY), response
    assert "x-envoy-ratelimited" not in response.headers, response


def _assert_limited(response: Response) -> None:
    assert response.status == 429, response
    assert response.headers.get("x-envoy-ratelimited") == "true", response
    assert response.body != UPSTREAM_BODY, response


def _assert_reset(response: Response) -> None:
    assert 0 < int(response.headers["x-ratelimit-reset"]) <= HOUR_S, response


def test_limited_route_refuses_after_the_limit(stack: Stack) -> None:
    before = stack.counters()
    with _one_window():
        responses = [stack.get("/limited/") for _ in range(5)]
    _check_rls(stack, before, ok=3, over_limit=2)

    for response in responses[:3]:
        _assert_allowed(response)
    for response in responses[3:]:
        _assert_limited(response)
    for response in responses:
        assert _limit_header(response) == 3, response
        _assert_reset(response)
    remaining = [int(r.headers["x-ratelimit-remaining"]) for r in responses]
    assert remaining == [2, 1, 0, 0, 0]


def test_shadow_mode_route_counts_but_never_refuses(stack: Stack) -> None:
    before = stack.counters()
    with _one_window():
        responses = [stack.get("/shadow/") for _ in range(5)]  # the limit is 1
    _check_rls(stack, before, ok=5, over_limit=0)

    for response in responses:
        _assert_allowed(response)
        # The shadow rule did match and count: its limit and remaining are reported.
        assert _limit_header(response) == 1, response
        _assert_reset(response)
    assert [int(r.headers["x-ratelimit-remaining"]) for r in responses] == [0] * 5


def test_unlimited_route_is_never_limited(stack: Stack) -> None:
    before = stack.counters()
    responses = [stack.get("/unlimited/") for _ in range(10)]  # nothing is counted
    _check_rls(stack, before, ok=10, over_limit=0)

    for response in responses:
        _assert_allowed(response)
        # An unlimited rule has no current_limit, so Envoy has no quota to report.
        assert "x-ratelimit-limit" not in response.headers, response


def test_api_key_and_path_are_limited_independently(stack: Stack) -> None:
    run = uuid.uuid4().hex
    alice, bob = {"x-api-key": f"alice-{run}"}, {"x-api-key": f"bob-{run}"}
    before = stack.counters()
    with _one_window():
        alice_items = [stack.get("/api/items", alice) for _ in range(3)]  # the limit is 2
        bob_items = [stack.get("/api/items", bob) for _ in range(2)]
        alice_orders = stack.get("/api/orders", alice)
        anonymous = stack.get("/api/items")  # no x-api-key: only remote_address (1000/hour)
    _check_rls(stack, before, ok=6, over_limit=1)

    _assert_allowed(alice_items[0])
    _assert_allowed(alice_items[1])
    _assert_limited(alice_items[2])
    for response in bob_items:
        _assert_allowed(response)
    _assert_allowed(alice_orders)
    _assert_allowed(anonymous)

    # The headers report the descriptor closest to its limit: api_key+path, not the address.
    keyed = [*alice_items, *bob_items, alice_orders]
    for response in keyed:
        assert _limit_header(response) == 2, response
        _assert_reset(response)
    assert [int(r.headers["x-ratelimit-remaining"]) for r in keyed] == [1, 0, 0, 1, 0, 1]
    assert _limit_header(anonymous) == 1000, anonymous
    assert 0 < int(anonymous.headers["x-ratelimit-remaining"]) < 1000, anonymous
