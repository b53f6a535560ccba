"""A rolling restart loses nothing: two ``sluice serve`` (Redis backend, a private
redis-server) behind one real Envoy running examples/envoy/envoy.yaml (its retry policy and
gRPC health checks as written; only the ports are rewritten and a second endpoint added),
under steady load; one of them is stopped with SIGTERM and a new process started on its
ports.

Envoy fails open, so a lost decision would pass as a 200: the test reads Envoy's own
counters, ``ratelimit.error`` and ``ratelimit.failure_mode_allowed``, which must stay 0, and
checks that every request over its limit was refused. Each round of the load uses a fresh
API key on /api, whose limit is 2 an hour per key and path: 200, 200, then 429; and a
loopback address of its own, so the route's other limit (1000 an hour per client address)
never bites.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import threading
import uuid
from pathlib import Path

import pytest

from tests.support.envoy import EnvoyProcess, envoy_serve
from tests.support.envoy_example import (
    ENVOY_CONFIG,
    POLICY,
    STATS,
    example_config,
    upstream_server,
)
from tests.support.processes import free_port, sluice_serve, wait_until
from tests.support.redis_servers import RedisProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DRAIN_DELAY_S = 2.5  # five of the example's 0.5 s health-check intervals


def with_timeout(config: dict, timeout: str) -> dict:
    """The example's rate-limit filter with another deadline (and each try's, which Envoy
    takes from the retry back-off's max_interval). Its 20 ms is Envoy's default and holds on
    a quiet machine (tests/e2e/test_envoy.py); here two servers, Envoy, the load and a
    starting Python process share two CPUs at the lowest priority, and a missed 20 ms would
    measure that contention, not the restart."""
    [listener] = config["static_resources"]["listeners"]
    [chain] = listener["filter_chains"]
    [manager] = chain["filters"]
    for http_filter in manager["typed_config"]["http_filters"]:
        if http_filter["name"] == "envoy.filters.http.ratelimit":
            typed = http_filter["typed_config"]
            typed["timeout"] = timeout
            typed["rate_limit_service"]["grpc_service"]["retry_policy"]["retry_back_off"][
                "max_interval"
            ] = timeout
    return config


def with_second_endpoint(config: dict, port: int) -> dict:
    """The example's ``sluice`` cluster with one more endpoint, a second replica."""
    [cluster] = [c for c in config["static_resources"]["clusters"] if c["name"] == "sluice"]
    [group] = cluster["load_assignment"]["endpoints"]
    group["lb_endpoints"].append(
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}
    )
    return config


class Load:
    """Rounds of three requests with a fresh API key, in a thread, until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.rounds: list[tuple[int, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        addresses = (f"127.1.{n // 250}.{n % 250 + 1}" for n in itertools.count())
        while not self._stop.is_set():
            key, source = uuid.uuid4().hex, next(addresses)
            self.rounds.append(self._round(source, key))

    def _round(self, source: str, key: str) -> tuple[int, ...]:
        # One connection a round, closed by Envoy (its last request says so), so the
        # connection's TIME_WAIT stays on Envoy's side, not on this client's ports.
        connection = http.client.HTTPConnection(
            "127.0.0.1", self.port, timeout=5, source_address=(source, 0)
        )
        statuses = []
        try:
            for last in (False, False, True):
                headers = {"x-api-key": key, **({"connection": "close"} if last else {})}
                connection.request("GET", "/api/", headers=headers)
                response = connection.getresponse()
                response.read()
                statuses.append(response.status)
        finally:
            connection.close()
        return tuple(statuses)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def rls_counters(envoy: EnvoyProcess) -> dict[str, int]:
    return {
        name.removeprefix(STATS): value
        for name, value in envoy.counters("ratelimit").items()
        if name.startswith(STATS)
    }


def healthy_hosts(envoy: EnvoyProcess) -> int:
    return envoy.counters(r"cluster\.sluice\.membership_healthy").get(
        "cluster.sluice.membership_healthy", 0
    )


@pytest.mark.parametrize("transport", ["grpcio", "pyvoy"])
def test_a_rolling_restart_loses_no_decision(
    tmp_path: Path, private_redis: RedisProcess, transport: str
) -> None:
    args = [
        "--transport", transport,
        "--backend", "redis",
        "--redis-url", private_redis.url,
        "--drain-delay-s", str(DRAIN_DELAY_S),
    ]  # fmt: skip
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    for directory in (first, second, third):
        directory.mkdir()
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(upstream_server())
        a = stack.enter_context(sluice_serve(first, config=POLICY, extra_args=args))
        b = stack.enter_context(sluice_serve(second, config=POLICY, extra_args=args))
        listener, admin = free_port(), free_port()
        config = example_config(
            ENVOY_CONFIG,
            listener=listener,
            admin=admin,
            upstream=upstream,
            sluice=a.grpc_port,
        )
        config = with_timeout(with_second_endpoint(config, b.grpc_port), "1s")
        envoy = stack.enter_context(
            envoy_serve(tmp_path, config, admin_port=admin, listener_ports=(listener,))
        )
        wait_until(lambda: healthy_hosts(envoy) == 2, 15, "both replicas healthy in Envoy")
        with Load(listener) as load:
            wait_until(lambda: len(load.rounds) >= 20, 30, "load before the restart")
            a.terminate(timeout_s=DRAIN_DELAY_S + 20)
            assert a.process.returncode == 0, a.log()
            during = len(load.rounds)
            restarted = stack.enter_context(
                sluice_serve(
                    third, config=POLICY, extra_args=args, ports=(a.grpc_port, a.http_port)
                )
            )
            wait_until(lambda: healthy_hosts(envoy) == 2, 15, "the new process healthy")
            wait_until(lambda: len(load.rounds) >= during + 20, 30, "load after the restart")
        counters = rls_counters(envoy)
        diagnostics = (
            f"{counters}\n--- envoy ---\n{envoy.log()}\n--- a ---\n{a.log()}\n"
            f"--- b ---\n{b.log()}\n--- restarted ---\n{restarted.log()}"
        )
        assert counters.get("error", 0) == 0, diagnostics
        assert counters.get("failure_mode_allowed", 0) == 0, diagnostics
        wrong = [r for r in load.rounds if r != (200, 200, 429)]
        assert not wrong, f"{len(wrong)} of {len(load.rounds)} rounds: {wrong[:5]}\n{diagnostics}"
        assert counters["over_limit"] == len(load.rounds)
        # The old process drained (not-ready first), and the new one took calls.
        assert "after 2.5s reporting not ready" in a.log()
        assert (
            envoy.counters(r"cluster\.sluice\.health_check\.failure")[
                "cluster.sluice.health_check.failure"
            ]
            > 0
        )
