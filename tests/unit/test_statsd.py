"""envoyproxy/ratelimit's statsd names and types (sluice/statsd.py): key paths as upstream's
config_impl.go builds them, its SanitizeStatName, tags as its sinks write them, datagrams."""

from __future__ import annotations

import asyncio
import socket

import pytest

from sluice.backends.memory import MemoryBackend
from sluice.clock import ManualClock
from sluice.limiter import RateLimiter
from sluice.model import Descriptor, LimitOverride, RateLimitRequest, Unit
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.statsd import MAX_DATAGRAM_BYTES, StatsdSink, pack, parse_tags, sanitize
from sluice.usage.recorder import ALLOWED, OVER_LIMIT, SHADOW_OVER, UsageRecorder

# Rules with the flags that put request values into upstream's statsd names. The expected
# names below are those envoyproxy/ratelimit (f2fb15770f7f) sent for this file and these
# requests; tests/integration/test_statsd_names.py compares with the running binary.
NAMES_CONFIG = """\
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: det
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: v2m
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: wild
    value: "ab*"
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: wildnov
    value: "ab*"
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: mid
    value: "a*z"
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: share
    value: "s*"
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: sharedet
    value: "s*"
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: parent
    value_to_metric: true
    descriptors:
      - key: child
        rate_limit: {unit: minute, requests_per_unit: 2}
      - key: exact
        value: x
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: pdet
    descriptors:
      - key: child
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: ten
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tenshadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: unl
    rate_limit: {unlimited: true}
  - key: unldet
    detailed_metric: true
    rate_limit: {unlimited: true}
"""
NAMES_REQUESTS: list[tuple[tuple[str, str], ...]] = [
    (("plain", "p1"),),
    (("det", "d1"),),
    (("det", ""),),
    (("v2m", "v1"),),
    (("v2m", ""),),
    (("wild", "abc"),),
    (("wildnov", "abc"),),
    (("mid", "abz"),),
    (("share", "s1"),),
    (("sharedet", "s1"),),
    (("parent", "P"), ("child", "C")),
    (("parent", "P"), ("exact", "x")),
    (("pdet", "P"), ("child", "C")),
    (("ten", "t"),),
    (("unl", "u"),),
    (("unldet", "u"),),
]
# A client's own limit (requests_per_unit 5 a minute) on these entries: named by them.
NAMES_OVERRIDE = (("plain", "o1"), ("k2", ""))
UPSTREAM_NAMES = {
    "d.plain",
    "d.det_d1",
    "d.det_",  # detailed_metric: an empty value still gets its "_"
    "d.v2m_v1",
    "d.v2m",  # value_to_metric: an empty value is the key alone
    "d.wild_abc",
    "d.wildnov_ab*",  # a wildcard without value_to_metric keeps its pattern
    "d.mid_abz",
    "d.share_s*",  # share_threshold: one counter, one name, whatever the flags
    "d.sharedet_s*",
    "d.parent_P.child",  # value_to_metric is per level: the child has none
    "d.parent_P.exact_x",
    "d.pdet_P.child_C",  # detailed_metric names every level, not only its own
    "d.ten",
    "d.plain_o1.k2",  # the override
    # Nothing for the unlimited rules, detailed or not: upstream counts nothing for them.
}


def names_sent(lines: list[str]) -> dict[str, int]:
    """Each rate-limit counter's value by name, its prefix off."""
    prefix = "ratelimit.service.rate_limit."
    return {
        name.removeprefix(prefix): int(value.removesuffix("|c"))
        for name, _, value in (line.partition(":") for line in lines)
        if name.startswith(prefix)
    }


def test_detailed_metric_value_to_metric_and_overrides_name_counters_as_upstream() -> None:
    snapshot = Snapshot(load_text(NAMES_CONFIG))
    recorder = UsageRecorder(named=True)
    limiter = RateLimiter(lambda: snapshot, MemoryBackend(), ManualClock(60.0), recorder=recorder)
    requests = [RateLimitRequest("d", (Descriptor(entries),)) for entries in NAMES_REQUESTS]
    limit = LimitOverride(5, Unit.MINUTE)
    requests.append(RateLimitRequest("d", (Descriptor(NAMES_OVERRIDE, limit),)))
    for request in requests:
        asyncio.run(limiter.should_rate_limit(request))
    sink = StatsdSink("h", 1)
    sink.add_usage(recorder.drain(), recorder.drain_named())
    sent = names_sent(sink.lines())
    assert {name.rsplit(".", 1)[0] for name in sent} == UPSTREAM_NAMES
    # One hit each, within its limit, as upstream counted them.
    assert {name.rsplit(".", 1)[1] for name in sent} == {"total_hits", "within_limit"}
    assert set(sent.values()) == {1}


def test_named_hits_count_under_their_name_only_and_stay_per_rule_for_prometheus() -> None:
    recorder = UsageRecorder(named=True)
    for name in ("d.k_a", "d.k_b", "d.k_a"):
        recorder.record("d.k", ALLOWED)
        recorder.record_named("d.k", name, ALLOWED)
    recorder.record("d.k", OVER_LIMIT, cost=2, local=True)
    recorder.record_named("d.k", "d.k_b", OVER_LIMIT, cost=2, local=True)
    recorder.record("d.free", ALLOWED, cost=4)
    recorder.record_named("d.free", "", ALLOWED, cost=4)  # "": statsd counts it nowhere
    rules = recorder.drain()
    assert rules["d.k"].counts[ALLOWED] == 3  # the rules' own counts are untouched
    sink = StatsdSink("h", 1)
    sink.add_usage(rules, recorder.drain_named())
    assert names_sent(sink.lines()) == {
        "d.k_a.total_hits": 2,
        "d.k_a.within_limit": 2,
        "d.k_b.total_hits": 3,
        "d.k_b.within_limit": 1,
        "d.k_b.over_limit": 2,
        "d.k_b.over_limit_with_local_cache": 2,
    }
    assert recorder.drain_named() == {}


def test_a_recorder_not_asked_for_names_keeps_none() -> None:
    recorder = UsageRecorder()
    recorder.record_named("d.k", "d.k_a", ALLOWED)
    assert recorder.drain_named() == {}


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
    recorder.record("rl.foo", ALLOWED, cost=3, near=3)
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


def test_tcp_sends_newline_terminated_lines_and_reconnects_after_a_failure() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(5)
        sink = StatsdSink("127.0.0.1", server.getsockname()[1], protocol="tcp")
        sink.observe_request(0.001)
        sink.flush()
        first, _ = server.accept()
        with first, first.makefile("r") as stream:
            assert stream.readline() == "ratelimit_server.ShouldRateLimit.total_requests:1|c\n"
        # The connection is gone: that flush fails (counted), the next one reconnects.
        for _ in range(50):
            sink.observe_request(0.001)
            sink.flush()
            if sink.send_failures:
                break
        assert sink.send_failures >= 1
        sink.observe_request(0.001)
        sink.flush()
        second, _ = server.accept()
        with second, second.makefile("r") as stream:
            assert stream.readline().startswith("ratelimit_server.ShouldRateLimit.total_requests:")


def test_a_tcp_statsd_that_is_not_there_costs_a_failure_not_a_crash() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    sink = StatsdSink("127.0.0.1", port, protocol="tcp")
    sink.observe_request(0.001)
    sink.flush()
    assert sink.send_failures == 1


CROSSING_CONFIG = """\
domain: c
descriptors:
  - key: ten
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
"""


def crossing_counters(calls: list[tuple[str, int]]) -> dict[str, int]:
    """The rate-limit counters statsd sends for hits of (key, hits_addend) on one counter per
    key, in a fixed window of 10 a minute (near the limit past 8)."""
    snapshot = Snapshot(load_text(CROSSING_CONFIG))
    recorder = UsageRecorder(named=True)
    limiter = RateLimiter(lambda: snapshot, MemoryBackend(), ManualClock(60.0), recorder=recorder)
    for key, cost in calls:
        request = RateLimitRequest("c", (Descriptor(((key, "v"),)),), hits_addend=cost)
        asyncio.run(limiter.should_rate_limit(request))
    sink = StatsdSink("h", 1)
    sink.add_usage(recorder.drain(), recorder.drain_named())
    return names_sent(sink.lines())


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        # 5 + 7 = 12: 2 past the limit over it, 2 past 8 near it, 3 in total_hits alone.
        ([("ten", 5), ("ten", 7)], {"total_hits": 12, "within_limit": 5, "near_limit": 2,
                                    "over_limit": 2}),
        # 9 (1 near), then 9 + 3 = 12: 2 over, the 10th near.
        ([("ten", 9), ("ten", 3)], {"total_hits": 12, "within_limit": 9, "near_limit": 2,
                                    "over_limit": 2}),
        # 15 at once, which never fits: 5 over, 2 near.
        ([("ten", 15)], {"total_hits": 15, "near_limit": 2, "over_limit": 5}),
        # Over already: the whole hit is over.
        ([("ten", 10), ("ten", 2), ("ten", 2)], {"total_hits": 14, "within_limit": 10,
                                                 "near_limit": 2, "over_limit": 4}),
        # Exactly to the limit: nothing over.
        ([("ten", 6), ("ten", 4)], {"total_hits": 10, "within_limit": 10, "near_limit": 2}),
    ],
)  # fmt: skip
def test_a_hit_crossing_the_limit_counts_over_only_its_part_past_it(
    calls: list[tuple[str, int]], expected: dict[str, int]
) -> None:
    assert crossing_counters(calls) == {f"c.ten.{k}": v for k, v in expected.items()}


def test_a_shadow_mode_hit_crossing_the_limit_is_shadow_mode_only_past_it() -> None:
    assert crossing_counters([("shadow", 5), ("shadow", 7)]) == {
        "c.shadow.total_hits": 12,
        "c.shadow.within_limit": 5,
        "c.shadow.near_limit": 2,
        "c.shadow.over_limit": 2,
        "c.shadow.shadow_mode": 2,
    }


def test_descriptors_of_unknown_domains_are_domain_not_found_per_domain() -> None:
    snapshot = Snapshot(load_text(CROSSING_CONFIG))
    recorder = UsageRecorder(named=True)
    limiter = RateLimiter(lambda: snapshot, MemoryBackend(), ManualClock(60.0), recorder=recorder)
    requests = [
        RateLimitRequest("nowhere", (Descriptor((("k", "a"),)), Descriptor((("k", "b"),)))),
        RateLimitRequest("a:b", (Descriptor((("k", "a"),)),)),
        RateLimitRequest("c", (Descriptor((("unknown", "a"),)),)),  # a known domain: not counted
    ]
    for request in requests:
        asyncio.run(limiter.should_rate_limit(request))
    sink = StatsdSink("h", 1, domains_not_found=recorder.drain_domains_not_found)
    assert sorted(sink.lines()) == [
        "ratelimit.service.rate_limit.a_b.domain_not_found:1|c",
        "ratelimit.service.rate_limit.nowhere.domain_not_found:2|c",
    ]
    assert sink.lines() == []  # drained
    assert UsageRecorder().drain_domains_not_found() == {}  # statsd off: nothing kept


def test_the_redis_connection_is_upstreams_pool_gauge_and_counters() -> None:
    state = {"redis_connections": 1.0, "redis_connections_opened": 1.0}
    state.update(redis_connections_closed=0.0)
    sink = StatsdSink("h", 1, state=lambda: state, tags={"env": "t"})
    assert sorted(sink.lines()) == [
        "ratelimit.redis_pool.cx_active.__env=t:1|g",
        "ratelimit.redis_pool.cx_total.__env=t:1|c",
    ]
    state.update(redis_connections_opened=3.0, redis_connections_closed=2.0)
    assert sorted(sink.lines()) == [
        "ratelimit.redis_pool.cx_active.__env=t:1|g",  # a gauge: sent at every flush
        "ratelimit.redis_pool.cx_local_close.__env=t:2|c",
        "ratelimit.redis_pool.cx_total.__env=t:2|c",
    ]
