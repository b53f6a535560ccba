"""The matching matrix: which rule applies to which descriptor, and which counter it uses."""

from __future__ import annotations

import textwrap

import pytest

from sluice.model import LimitOverride, Unit
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text

POLICY = textwrap.dedent(
    """
    domain: d
    descriptors:
      - key: remote_address
        rate_limit: {name: per_ip, unit: second, requests_per_unit: 10}
      - key: remote_address
        value: 50.0.0.5
        rate_limit: {unit: second, requests_per_unit: 0}
      - key: remote_address
        value: 10.*
        rate_limit: {unit: second, requests_per_unit: 100}
      - key: path
        value: /api/*/items
        rate_limit: {unit: minute, requests_per_unit: 7}
      - key: path
        value: /api/*
        rate_limit: {unit: minute, requests_per_unit: 8}
      - key: tenant
        value: t-*
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 3}
      - key: message_type
        value: marketing
        descriptors:
          - key: to_number
            rate_limit: {unit: day, requests_per_unit: 5}
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 100}
      - key: whitelisted
      - key: key
        value: value
        rate_limit: {unit: second, requests_per_unit: 300}
      - key: parent
        descriptors:
          - key: child
            value: exact
            descriptors:
              - key: leaf
                rate_limit: {unit: second, requests_per_unit: 1}
          - key: child
            rate_limit: {unit: second, requests_per_unit: 2}
    """
)

SNAPSHOT = Snapshot(load_text(POLICY, "matrix.yaml"))


def limit_of(*entries: tuple[str, str], domain: str = "d") -> int | None:
    match = SNAPSHOT.lookup(domain, tuple(entries))
    return None if match is None else match.limits[0].requests_per_unit


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        pytest.param([("remote_address", "1.2.3.4")], 10, id="key-only"),
        pytest.param([("remote_address", "50.0.0.5")], 0, id="exact-beats-key-only"),
        pytest.param([("remote_address", "10.1.2.3")], 100, id="wildcard-beats-key-only"),
        pytest.param([("remote_address", "10")], 10, id="wildcard-needs-its-literal-part"),
        pytest.param([("path", "/api/v1/items")], 7, id="wildcard-in-the-middle-first-wins"),
        pytest.param([("path", "/api/v1/other")], 8, id="trailing-wildcard"),
        pytest.param([("path", "/web")], None, id="no-wildcard-matches"),
        pytest.param([("message_type", "marketing"), ("to_number", "1")], 5, id="nested"),
        pytest.param([("to_number", "1")], 100, id="top-level-key-only"),
        pytest.param([("message_type", "marketing")], None, id="placeholder-has-no-limit"),
        pytest.param([("message_type", "other"), ("to_number", "1")], None, id="no-match-level-1"),
        pytest.param([("whitelisted", "x")], None, id="whitelist-node"),
        pytest.param([("key", "value"), ("subkey", "subvalue")], None, id="depth-deeper-request"),
        pytest.param([("parent", "p")], None, id="depth-shallower-request"),
        pytest.param([("parent", "p"), ("child", "exact"), ("leaf", "x")], 1, id="three-levels"),
        pytest.param([("parent", "p"), ("child", "other")], 2, id="sibling-key-only"),
        pytest.param([("parent", "p"), ("child", "exact")], None, id="no-backtracking"),
        pytest.param([("unknown", "x")], None, id="unknown-key"),
    ],
)
def test_matching(entries: list[tuple[str, str]], expected: int | None) -> None:
    assert limit_of(*entries) == expected


def test_unknown_domain_matches_nothing() -> None:
    assert limit_of(("remote_address", "1.2.3.4"), domain="other") is None
    assert not SNAPSHOT.has_domain("other")


def test_key_only_and_wildcard_rules_count_each_value_separately() -> None:
    a = SNAPSHOT.lookup("d", (("remote_address", "10.0.0.1"),))
    b = SNAPSHOT.lookup("d", (("remote_address", "10.0.0.2"),))
    assert a is not None and b is not None
    assert a.counter_key == ("d", "remote_address", "10.0.0.1")
    assert a.counter_key != b.counter_key


def test_share_threshold_makes_every_matching_value_share_one_counter() -> None:
    a = SNAPSHOT.lookup("d", (("tenant", "t-1"),))
    b = SNAPSHOT.lookup("d", (("tenant", "t-2"),))
    assert a is not None and b is not None
    assert a.counter_key == b.counter_key == ("d", "tenant", "t-*")


def test_wildcard_characters_other_than_star_are_literal() -> None:
    snapshot = Snapshot(
        load_text(
            "domain: d\ndescriptors:\n  - key: k\n    value: a.b*\n"
            "    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "t.yaml",
        )
    )
    assert snapshot.lookup("d", (("k", "a.bc"),)) is not None
    assert snapshot.lookup("d", (("k", "aXbc"),)) is None


def test_only_rules_naming_metrics_with_request_values_carry_a_metric_name() -> None:
    snapshot = Snapshot(load_text(POLICY))
    # A rule without detailed_metric / value_to_metric: statsd names it by its rule id.
    plain = snapshot.lookup("d", (("remote_address", "10.1.2.3"),))
    assert plain is not None and plain.metric_name is None
    assert plain.rule_id == "d.remote_address_10.*"
    flagged = Snapshot(
        load_text(
            textwrap.dedent(
                """
                domain: d
                descriptors:
                  - key: tenant
                    value_to_metric: true
                    descriptors:
                      - key: user
                        detailed_metric: true
                        rate_limit: {unit: second, requests_per_unit: 1}
                      - key: path
                        value: /api/*
                        rate_limit: {unit: second, requests_per_unit: 1}
                """
            )
        )
    )
    detailed = flagged.lookup("d", (("tenant", "t1"), ("user", "")))
    assert detailed is not None and detailed.metric_name == "d.tenant_t1.user_"
    per_level = flagged.lookup("d", (("tenant", ""), ("path", "/api/v1")))
    assert per_level is not None and per_level.metric_name == "d.tenant.path_/api/*"
    assert per_level.rule_id == "d.tenant.path_/api/*"
    override = flagged.override("d", (("tenant", "t1"), ("x", "")), LimitOverride(1, Unit.HOUR))
    assert override is not None and override.metric_name == "d.tenant_t1.x"
