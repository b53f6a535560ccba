"""A bucket matched to the rule chain with its keys, as ShouldRateLimit matches entries."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sluice.errors import ConfigError
from sluice.model import Pin, RateLimit, Unit
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.rlqs.buckets import ALLOW_ALL, DENY_ALL, TOKEN_BUCKET, BucketIndex, Governed

POLICY = """
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 600, algorithm: token_bucket, burst: 50}
  - key: tenant
    value: "beta-*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: tenant
    value: zero
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    value: vip
    rate_limit: {unlimited: true}
  - key: tenant
    value: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: plan
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 30}
  - key: two
    rate_limit:
      limits:
        - {unit: second, requests_per_unit: 5}
        - {unit: minute, requests_per_unit: 60}
"""


def index(text: str = POLICY, pins: tuple[Pin, ...] = ()) -> BucketIndex:
    [policy] = load_text(text, "policy.yaml")
    return BucketIndex(Snapshot([dataclasses.replace(policy, pins=pins)]))


def test_values_match_as_in_should_rate_limit() -> None:
    idx = index()
    assert idx.govern("api", {"tenant": "someone"}, 0) == Governed(
        TOKEN_BUCKET, "api.tenant", ("api", "tenant", "someone"), 10.0, 10
    )
    exact = idx.govern("api", {"tenant": "acme"}, 0)
    assert (exact.rule_id, exact.rate_per_s, exact.burst) == ("api.tenant_acme", 10.0, 50)
    assert idx.govern("api", {"tenant": "beta-7"}, 0).rate_per_s == 2.0


def test_bucket_keys_match_the_chain_in_any_order() -> None:
    idx = index()
    a = idx.govern("api", {"path": "/x", "plan": "free"}, 0)
    b = idx.govern("api", {"plan": "free", "path": "/x"}, 0)
    assert a == b
    assert a.share_key == ("api", "plan", "free", "path", "/x")
    assert a.rate_per_s == pytest.approx(0.5)


def test_what_no_rule_limits_is_allowed_and_a_zero_limit_denied() -> None:
    idx = index()
    assert idx.govern("api", {"other": "x"}, 0).kind == ALLOW_ALL
    assert idx.govern("api", {"plan": "free"}, 0).kind == ALLOW_ALL  # placeholder: no limit
    assert idx.govern("api", {"tenant": "vip"}, 0).kind == ALLOW_ALL
    assert idx.govern("api", {"tenant": "shadow"}, 0).kind == ALLOW_ALL
    assert idx.govern("api", {"tenant": "zero"}, 0).kind == DENY_ALL
    assert idx.govern("nope", {"tenant": "x"}, 0).kind == ALLOW_ALL


def test_the_lowest_rate_of_several_limits_governs() -> None:
    assert index().govern("api", {"two": "x"}, 0).rate_per_s == 1.0  # 60/minute < 5/second


def test_pins_apply_until_they_expire() -> None:
    entries = (("tenant", "acme"),)
    override = Pin("overrides", (("tenant", "big"),), RateLimit(100, Unit.SECOND), 50.0)
    idx = index(pins=(Pin("blocks", entries, expires_at_s=100.0), override))
    blocked = idx.govern("api", {"tenant": "acme"}, 10)
    assert (blocked.kind, blocked.expires_at_s) == (DENY_ALL, 100.0)
    assert idx.govern("api", {"tenant": "acme"}, 100).kind == TOKEN_BUCKET
    big = idx.govern("api", {"tenant": "big"}, 10)
    assert (big.rate_per_s, big.expires_at_s) == (100.0, 50.0)
    assert big.share_key[-1] == "#override"  # its own counter, not the rule's
    after = idx.govern("api", {"tenant": "big"}, 60)
    assert (after.rate_per_s, after.expires_at_s) == (10.0, math.inf)


def test_a_policy_with_two_orders_of_one_key_set_is_refused_naming_the_line() -> None:
    text = """
domain: d
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 1}
"""
    with pytest.raises(ConfigError, match=r"policy.yaml:10: the rule chain b → a .* a → b"):
        load_text(text, "policy.yaml")


def test_one_order_with_different_values_is_not_ambiguous() -> None:
    text = """
domain: d
descriptors:
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 2}
"""
    idx = index(text)
    assert idx.govern("d", {"b": "1", "a": "x"}, 0).rate_per_s == 1.0
    assert idx.govern("d", {"b": "1", "a": "y"}, 0).rate_per_s == 2.0
