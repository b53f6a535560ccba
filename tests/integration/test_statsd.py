"""``sluice serve`` configured only by envoyproxy/ratelimit's variables, statsd on: decisions
per the YAML, counters in the private Redis, and upstream's statsd lines arriving at a TCP
listener of the test (over TCP, as upstream's statsd client sends by default)."""

from __future__ import annotations

import socket
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.redis_support import data_nodes, scan_keys
from tests.integration.test_upstream_env import OK, OVER_LIMIT, configmap_mount, decide
from tests.support.processes import sluice_serve, wait_until
from tests.support.redis_servers import RedisProcess


class StatsdListener:
    """A UDP socket collecting statsd lines, as a statsd server would receive them."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.setblocking(False)
        self.port = self.socket.getsockname()[1]
        self.lines: list[str] = []
        self.largest = 0

    def receive(self) -> list[str]:
        while True:
            try:
                datagram = self.socket.recv(65535)
            except BlockingIOError:
                return self.lines
            self.largest = max(self.largest, len(datagram))
            self.lines += datagram.decode().split("\n")

    def counters(self) -> Counter[str]:
        """Each counter's sum over every line received so far."""
        sums: Counter[str] = Counter()
        for line in self.receive():
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            if kind.startswith("c"):
                sums[name] += int(value)
        return sums

    def gauges(self) -> dict[str, int]:
        """Each gauge's last value received so far."""
        last: dict[str, int] = {}
        for line in self.receive():
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            if kind.startswith("g"):
                last[name] = int(value)
        return last


class TcpStatsdListener(StatsdListener):
    """The same over TCP (statsd_exporter's other listener): newline-terminated lines on
    connections accepted by a thread."""

    def __init__(self) -> None:  # not super().__init__(): that binds a UDP socket
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.lines = []
        self.largest = 0
        self.connections = 0
        self._received: list[str] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            connection, _ = self.server.accept()
            self.connections += 1
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        with connection, connection.makefile("r") as stream:
            for line in stream:
                with self._lock:
                    self._received.append(line.rstrip("\n"))

    def receive(self) -> list[str]:
        with self._lock:
            self.lines = list(self._received)
        return self.lines


@pytest.mark.slow
def test_upstream_statsd_names_from_a_server_started_with_upstreams_variables(
    tmp_path: Path, private_redis: RedisProcess
) -> None:
    configmap_mount(tmp_path / "runtime")
    listener = TcpStatsdListener()  # upstream's statsd client sends over TCP by default
    env = {
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": private_redis.url.removeprefix("redis://").split("/")[0],
        "RUNTIME_ROOT": str(tmp_path / "runtime"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_IGNOREDOTFILES": "true",
        "USE_STATSD": "true",
        "STATSD_HOST": "127.0.0.1",
        "STATSD_PORT": str(listener.port),
        "STATS_FLUSH_INTERVAL": "200ms",
        "EXTRA_TAGS": "env:test",
    }
    prefix = "ratelimit.service.rate_limit.rl."
    with sluice_serve(tmp_path, upstream_only=True, env=env) as server:
        nested = (("source_cluster", "proxy"), ("destination_cluster", "mock"))
        assert [decide(server, *nested) for _ in range(4)] == [OK, OK, OVER_LIMIT, OVER_LIMIT]
        assert [decide(server, ("foo", "bar")) for _ in range(2)] == [OK, OVER_LIMIT]
        keys = [key for _, key in scan_keys(data_nodes(private_redis.url), "*")]
        wait_until(
            lambda: listener.counters()[prefix + "foo.total_hits.__env=test"] == 2,
            timeout_s=10,
            what="the rule counters to arrive",
        )
        log = server.log()
    assert len(keys) == 2, keys  # the two limited descriptors' counters, in REDIS_URL's Redis
    counters = listener.counters()
    path = prefix + "source_cluster_proxy.destination_cluster_mock"
    tag = ".__env=test"
    assert {name: n for name, n in counters.items() if name.startswith(prefix)} == {
        f"{path}.total_hits{tag}": 4,
        f"{path}.within_limit{tag}": 2,
        f"{path}.near_limit{tag}": 1,  # 2 of 2 used: past NEAR_LIMIT_RATIO's 0.8
        # Refused by Redis both times: upstream's local cache is off unless given a size.
        f"{path}.over_limit{tag}": 2,
        f"{prefix}foo.total_hits{tag}": 2,
        f"{prefix}foo.within_limit{tag}": 1,
        f"{prefix}foo.near_limit{tag}": 1,
        f"{prefix}foo.over_limit{tag}": 1,
    }
    # The decisions' one Redis connection, as upstream's pool gauge and counter.
    assert listener.gauges()[f"ratelimit.redis_pool.cx_active{tag}"] == 1
    assert counters[f"ratelimit.redis_pool.cx_total{tag}"] == 1
    assert counters[f"ratelimit_server.ShouldRateLimit.total_requests{tag}"] == 6
    assert counters[f"ratelimit.service.config_load_success{tag}"] >= 1
    timers = [line for line in listener.lines if "|ms" in line]
    assert len(timers) == 6
    timer = f"ratelimit_server.ShouldRateLimit.response_time{tag}:"
    assert all(t.startswith(timer) for t in timers)
    assert listener.connections == 1  # one connection, kept across flushes
    # None of the statsd variables is among those named as not honoured (if any line is).
    warnings = [line for line in log.splitlines() if "not honoured" in line]
    assert not any(n in w for w in warnings for n in ("STATSD", "EXTRA_TAGS", "STATS_FLUSH"))
