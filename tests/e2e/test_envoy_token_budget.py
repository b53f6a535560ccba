"""End to end: examples/envoy/token-budget.yaml, a real Envoy charging each request the
tokens its upstream reports (``apply_on_stream_done`` with ``hits_addend`` from the
``x-tokens-used`` response header) against `sluice serve` with
examples/envoy/token-budget-ratelimit.yaml, a calendar-month budget per tenant.

Only the ports are rewritten. The upstream is a small model-server stand-in that answers
with ``x-tokens-used`` taken from the request's ``x-test-tokens`` and counts its calls.
Sluice's count is read through its ``/json`` endpoint with a per-descriptor ``hits_addend``
of 0 (a check that consumes nothing), which is also how Envoy's first rate limit asks.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from zoneinfo import ZoneInfo

import pytest

from tests.support.envoy import (
    EnvoyProcess,
    Response,
    envoy_binary,
    envoy_serve,
    http_get,
)
from tests.support.envoy_example import EXAMPLES, example_config, upstream_server
from tests.support.processes import SluiceProcess, free_port, sluice_serve, wait_until

pytestmark = pytest.mark.e2e

ENVOY_CONFIG = EXAMPLES / "token-budget.yaml"
POLICY = EXAMPLES / "token-budget-ratelimit.yaml"
# The ports written in examples/envoy/token-budget.yaml.
EXAMPLE_LISTENER, EXAMPLE_ADMIN, EXAMPLE_UPSTREAM, EXAMPLE_SLUICE = 10000, 9902, 8000, 8081
DEMO_BUDGET = 100  # tenant=demo's tokens a month in the policy
BODY = '{"choices": []}'


class ModelServer(BaseHTTPRequestHandler):
    calls = 0

    def do_GET(self) -> None:  # noqa: N802 (the name is fixed by http.server)
        type(self).calls += 1
        body = BODY.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        tokens = self.headers.get("x-test-tokens")
        if tokens is not None:  # else a response that reports no usage
            self.send_header("x-tokens-used", tokens)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@dataclass
class Stack:
    envoy: EnvoyProcess
    sluice: SluiceProcess
    port: int

    def ask(self, tenant: str, tokens: int) -> Response:
        headers = {"x-tenant": tenant, "x-test-tokens": str(tokens)}
        return http_get(self.port, "/v1/chat/completions", headers)

    def check(self, tenant: str) -> tuple[str, int]:
        """Sluice's answer for ``tenant`` now, (code, limit_remaining), from a check that
        consumes nothing (hits_addend 0), as Envoy's first rate limit asks."""
        request = {
            "domain": "ai",
            "descriptors": [{"entries": [{"key": "tenant", "value": tenant}], "hits_addend": 0}],
        }
        url = f"{self.sluice.http_url}/json"
        try:
            with urllib.request.urlopen(url, json.dumps(request).encode(), timeout=5) as reply:
                answer = json.load(reply)
        except urllib.error.HTTPError as exc:  # 429: over the limit, the answer is the body
            answer = json.load(exc)
        status = answer["statuses"][0]
        return status["code"], int(status.get("limitRemaining", 0))

    def diagnostics(self) -> str:
        return f"--- envoy log ---\n{self.envoy.log()}\n--- sluice log ---\n{self.sluice.log()}"


# Against both transports of Sluice's gRPC port, as tests/e2e/test_envoy.py.
@pytest.fixture(scope="module", params=["grpcio", "pyvoy"])
def stack(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    try:
        envoy_binary()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))  # never a skip: a missing Envoy must not pass as green
    workdir = tmp_path_factory.mktemp("envoy-tokens")
    transport = ["--transport", request.param]
    with (
        upstream_server(ModelServer) as model,
        sluice_serve(workdir, config=POLICY, extra_args=transport) as sluice,
    ):
        listener, admin = free_port(), free_port()
        config = example_config(
            ENVOY_CONFIG,
            listener=listener,
            admin=admin,
            upstream=model,
            sluice=sluice.grpc_port,
            written=(EXAMPLE_LISTENER, EXAMPLE_ADMIN, EXAMPLE_UPSTREAM, EXAMPLE_SLUICE),
        )
        with envoy_serve(workdir, config, admin_port=admin, listener_ports=(listener,)) as envoy:
            yield Stack(envoy, sluice, listener)


def _wait_for(stack: Stack, tenant: str, expected: tuple[str, int]) -> None:
    # The charge is sent when the stream is done, and Envoy does not wait for its answer.
    wait_until(lambda: stack.check(tenant) == expected, 10, f"{tenant} at {expected}")


def test_each_request_is_charged_the_tokens_its_response_reports(stack: Stack) -> None:
    calls = ModelServer.calls
    assert stack.check("demo") == ("OK", DEMO_BUDGET)
    first = stack.ask("demo", 40)
    assert (first.status, first.body) == (200, BODY), stack.diagnostics()
    # The check before forwarding consumed nothing: the whole budget was left.
    assert int(first.headers["x-ratelimit-remaining"]) == DEMO_BUDGET
    _wait_for(stack, "demo", ("OK", DEMO_BUDGET - 40))

    second = stack.ask("demo", 70)  # admitted (60 left), and takes the month past its budget
    assert second.status == 200, second
    assert int(second.headers["x-ratelimit-remaining"]) == DEMO_BUDGET - 40
    _wait_for(stack, "demo", ("OVER_LIMIT", 0))

    third = stack.ask("demo", 5)
    assert third.status == 429, third
    assert third.headers.get("x-envoy-ratelimited") == "true", third
    assert ModelServer.calls == calls + 2  # the refused request never reached the model


def test_a_response_without_the_header_is_charged_nothing(stack: Stack) -> None:
    unreported = http_get(stack.port, "/v1/models", {"x-tenant": "quiet"})
    assert unreported.status == 200 and "x-tokens-used" not in unreported.headers
    # The next request's charge lands after the first one's would have (one stream after
    # the other): only its 3 tokens are counted.
    assert stack.ask("quiet", 3).status == 200
    _wait_for(stack, "quiet", ("OK", 100_000 - 3))


def test_the_budget_resets_at_the_tenants_calendar_month(stack: Stack) -> None:
    response = stack.ask("reset-check", 1)
    assert response.status == 200, stack.diagnostics()
    zone = ZoneInfo("America/New_York")
    now = datetime.now(zone)
    month = now.year * 12 + now.month  # the next month, 1-based
    next_month = datetime(month // 12, month % 12 + 1, 1, tzinfo=zone)
    until = next_month.timestamp() - time.time()
    # Envoy reports the reset in whole seconds, rounded up; this test's clock read comes
    # after Sluice's, so allow a couple of seconds of lag.
    assert 0 <= math.ceil(until) - int(response.headers["x-ratelimit-reset"]) <= 2
    assert int(response.headers["x-ratelimit-limit"].split(",")[0]) == 100_000
