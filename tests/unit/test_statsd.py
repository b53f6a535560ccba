"""envoyproxy/ratelimit's statsd names and types (sluice/statsd.py): key paths as upstream's
config_impl.go builds them, its SanitizeStatName, tags as its sinks write them, datagrams."""

from __future__ import annotations

import socket

import pytest

from sluice.statsd import MAX_DATAGRAM_BYTES, StatsdSink, metric_key, pack, parse_tags, sanitize
from sluice.usage.recorder import ALLOWED, OVER_LIMIT, SHADOW_OVER, UsageRecorder

ENTRIES = (("source_cluster", "proxy"), ("destination_cluster", "mock"))


@pytest.mark.parametrize(
    ("entries", "rule_path", "options", "expected"),
    [
        # The rule's own path: key_value for a value rule, key for a key-only one.
        (ENTRIES, (("source_cluster", "proxy"), ("destination_cluster", None)), {},
         "d.source_cluster_proxy.destination_cluster"),
        ((("foo", "bar"),), (("foo", None),), {}, "d.foo"),
        # A wildcard keeps its pattern...
        ((("path", "/api/v1"),), (("path", "/api/*"),), {}, "d.path_/api/*"),
        # ...unless value_to_metric puts the request's value in, at that level only.
        ((("path", "/api/v1"),), (("path", "/api/*"),), {"value_to_metric": (True,)},
         "d.path_/api/v1"),
        (ENTRIES, (("source_cluster", None), ("destination_cluster", None)),
         {"value_to_metric": (False, True)}, "d.source_cluster.destination_cluster_mock"),
        ((("foo", ""),), (("foo", None),), {"value_to_metric": (True,)}, "d.foo"),
        # detailed_metric: every request value, an empty one as "key_".
        (ENTRIES, (("source_cluster", None), ("destination_cluster", None)),
         {"detailed_metric": True}, "d.source_cluster_proxy.destination_cluster_mock"),
        ((("foo", ""),), (("foo", None),), {"detailed_metric": True}, "d.foo_"),
    ],
)  # fmt: skip
def test_metric_key_follows_upstreams_rules(
    entries: tuple[tuple[str, str], ...],
    rule_path: tuple[tuple[str, str | None], ...],
    options: dict[str, object],
    expected: str,
) -> None:
    assert metric_key("d", entries, rule_path, **options) == expected  # type: ignore[arg-type]


def test_sanitize_replaces_what_ends_a_statsd_name_and_ipv4_dots() -> None:
    assert sanitize("d.remote_address_10.0.0.1") == "d.remote_address_10_0_0_1"
    assert sanitize("d.k_a:b|c") == "d.k_a_b_c"
    assert sanitize("d.version_1.2") == "d.version_1.2"  # not an address: dots stay


def test_parse_tags_reads_upstreams_extra_tags() -> None:
    assert parse_tags("env:prod, team:edge") == {"env": "prod", "team": "edge"}
    assert parse_tags("") == {}
    with pytest.raises(ValueError, match="'oops' is not KEY:VALUE"):
        parse_tags("env:prod,oops")


def usage_lines(sink: StatsdSink) -> list[str]:
    recorder = UsageRecorder()
    recorder.record("rl.foo", ALLOWED, cost=3, near=True)
    recorder.record("rl.foo", OVER_LIMIT, cost=2, local=True)
    recorder.record("rl.remote_address_10.1.2.3", SHADOW_OVER)
    sink.add_usage(recorder.drain())
    sink.observe_request(0.0025)
    return sink.lines()


def test_rule_counters_and_server_metrics_have_upstreams_names_and_types() -> None:
    lines = usage_lines(StatsdSink("localhost", 8125))
    assert sorted(lines) == sorted([
        "ratelimit.service.rate_limit.rl.foo.total_hits:5|c",
        "ratelimit.service.rate_limit.rl.foo.over_limit:2|c",
        "ratelimit.service.rate_limit.rl.foo.over_limit_with_local_cache:2|c",
        "ratelimit.service.rate_limit.rl.foo.near_limit:3|c",
        "ratelimit.service.rate_limit.rl.foo.within_limit:3|c",
        "ratelimit.service.rate_limit.rl.remote_address_10_1_2_3.total_hits:1|c",
        "ratelimit.service.rate_limit.rl.remote_address_10_1_2_3.over_limit:1|c",
        "ratelimit.service.rate_limit.rl.remote_address_10_1_2_3.shadow_mode:1|c",
        "ratelimit_server.ShouldRateLimit.total_requests:1|c",
        "ratelimit_server.ShouldRateLimit.response_time:2.500|ms",
    ])  # fmt: skip
    assert StatsdSink("localhost", 8125).lines() == []  # nothing counted, nothing sent


def test_dogstatsd_tags_and_gostats_tags() -> None:
    dog = usage_lines(StatsdSink("h", 1, flavor="dogstatsd", tags={"env": "prod", "az": "b"}))
    assert "ratelimit.service.rate_limit.rl.foo.total_hits:5|c|#az:b,env:prod" in dog
    assert "ratelimit_server.ShouldRateLimit.response_time:2.500|ms|#az:b,env:prod" in dog
    plain = usage_lines(StatsdSink("h", 1, tags={"env": "prod.eu"}))
    assert "ratelimit.service.rate_limit.rl.foo.total_hits.__env=prod_eu:5|c" in plain


def test_totals_kept_elsewhere_are_sent_as_their_increase() -> None:
    state = {"config_loads": 1.0, "config_invalid_versions": 0.0, "redis_errors": 2.0}
    state.update(service_errors=1.0, global_shadow_answers=4.0)
    sink = StatsdSink("h", 1, state=lambda: state)
    assert sorted(sink.lines()) == [
        "ratelimit.service.call.should_rate_limit.redis_error:2|c",
        "ratelimit.service.call.should_rate_limit.service_error:1|c",
        "ratelimit.service.config_load_success:1|c",
        "ratelimit.service.global_shadow_mode:4|c",
    ]
    state.update(config_loads=3.0, config_invalid_versions=1.0)
    assert sorted(sink.lines()) == [
        "ratelimit.service.config_load_error:1|c",
        "ratelimit.service.config_load_success:2|c",
    ]


def test_flush_sends_datagrams_of_at_most_1432_bytes_holding_every_line() -> None:
    sent: list[bytes] = []
    sink = StatsdSink("h", 1, send=sent.append)
    for _ in range(500):
        sink.observe_request(0.001)
    sink.flush()
    assert len(sent) > 1
    assert all(len(datagram) <= MAX_DATAGRAM_BYTES for datagram in sent)
    lines = [line for datagram in sent for line in datagram.decode().split("\n")]
    assert lines.count("ratelimit_server.ShouldRateLimit.response_time:1.000|ms") == 500
    assert "ratelimit_server.ShouldRateLimit.total_requests:500|c" in lines
    assert pack(["x" * 2000, "y"]) == [b"x" * 2000, b"y"]  # a long line goes alone


@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
def test_lines_reach_a_udp_listener_over_ipv4_and_ipv6(family: int, host: str) -> None:
    with socket.socket(family, socket.SOCK_DGRAM) as listener:
        listener.bind((host, 0))
        listener.settimeout(5)
        sink = StatsdSink(host, listener.getsockname()[1])
        sink.observe_request(0.001)
        sink.flush()
        received = listener.recv(MAX_DATAGRAM_BYTES).decode().split("\n")
    assert "ratelimit_server.ShouldRateLimit.total_requests:1|c" in received
