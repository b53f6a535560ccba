"""Reading envoyproxy/ratelimit's counter names (``<prefix><domain>_<key>_<value>_..._<window
start>``) back into the rule and window they count for (sluice/backends/redis/migrate.py)."""

from __future__ import annotations

import pytest

from sluice.backends.redis.migrate import descriptor_keys, parse_upstream_key
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text

POLICY = """\
domain: my_app
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user_id
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: gcra_user
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: gcra}
"""
POLICIES = load_text(POLICY, "p.yaml")
SNAPSHOT = Snapshot(POLICIES)
KEYS = descriptor_keys(POLICIES)


def parse(key: str, prefix: str = "rl_") -> tuple[str, tuple[str, ...], int, int] | None:
    counter = parse_upstream_key(key, prefix, SNAPSHOT, KEYS)
    if counter is None:
        return None
    return counter.match.rule_id, counter.match.counter_key, counter.window_start, counter.period_s


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        # nested rule; the domain and a value hold "_" themselves
        (
            "rl_my_app_source_cluster_proxy_destination_cluster_mock_svc_1764115200",
            ("my_app.source_cluster_proxy.destination_cluster",
             ("my_app", "source_cluster", "proxy", "destination_cluster", "mock_svc"),
             1764115200, 60),
        ),
        # key-only rule, a value ending in digits and "_"
        (
            "rl_my_app_user_id_alice_2_1764115200",
            ("my_app.user_id", ("my_app", "user_id", "alice_2"), 1764115200, 3600),
        ),
        # share_threshold: upstream names the pattern, as Sluice's counter key does
        (
            "rl_my_app_path_/files/*_1764115201",
            ("my_app.path_/files/*", ("my_app", "path", "/files/*"), 1764115201, 1),
        ),
    ],
)  # fmt: skip
def test_upstream_names_are_read_back_into_rule_and_window(key: str, expected: tuple) -> None:
    assert parse(key) == expected


@pytest.mark.parametrize(
    "key",
    [
        "rl_other_user_id_alice_1764115200",  # no such domain
        "rl_my_app_user_id_alice_1764115201",  # not the start of an hour window
        "rl_my_app_gcra_user_alice_1764115200",  # not a fixed window
        "rl_my_app_source_cluster_proxy_1764115200",  # no limit at that depth
        "rl_my_app_user_id_alice_now",  # no window start
        "other_my_app_user_id_alice_1764115200",  # another prefix
        "rl_{my_app:user_id:alice}:fixed_window:3600",  # Sluice's own key
    ],
)
def test_names_of_no_fixed_window_rule_are_not_read(key: str) -> None:
    assert parse(key) is None
