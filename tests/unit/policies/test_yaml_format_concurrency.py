"""``rate_limit: {concurrency: N, lease_ttl: D}``: loaded, dumped, and refused by line."""

from __future__ import annotations

import pytest

from sluice.errors import ConfigError
from sluice.model import DEFAULT_LEASE_TTL_S, Concurrency
from sluice.policies.descriptor_text import format_duration, parse_duration
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import dump_policy, load_text


def rule_block(block: str) -> str:
    return f"domain: jobs\ndescriptors:\n  - key: tenant\n    rate_limit: {block}\n"


def problems(block: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        load_text(rule_block(block), "p.yaml")
    return raised.value.problems


def test_concurrency_loads_with_the_default_lease_ttl_and_dumps_back() -> None:
    [policy] = load_text(rule_block("{name: reports, concurrency: 20}"), "p.yaml")
    [rule] = policy.descriptors
    assert rule.concurrency == Concurrency(20, DEFAULT_LEASE_TTL_S)
    assert rule.limits == () and rule.name == "reports" and rule.applies_limit
    text = dump_policy(policy)
    assert "concurrency: 20" in text and "lease_ttl" not in text
    assert load_text(text, "again.yaml") == [policy]


@pytest.mark.parametrize(("ttl", "seconds"), [("500ms", 0.5), ("2m", 120.0), ("1d", 86400.0)])
def test_lease_ttl_is_a_duration_that_round_trips(ttl: str, seconds: float) -> None:
    [policy] = load_text(rule_block(f"{{concurrency: 3, lease_ttl: {ttl}}}"), "p.yaml")
    assert policy.descriptors[0].concurrency == Concurrency(3, seconds)
    assert load_text(dump_policy(policy), "again.yaml") == [policy]


def test_concurrency_zero_admits_nothing_but_is_valid() -> None:
    [policy] = load_text(rule_block("{concurrency: 0}"), "p.yaml")
    assert policy.descriptors[0].concurrency == Concurrency(0)


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ("{concurrency: -1}", "p.yaml:4: 'concurrency' must be between 0 and 4294967295"),
        ("{concurrency: 4294967296}", "p.yaml:4: 'concurrency' must be between 0 and 4294967295"),
        ("{concurrency: ten}", "p.yaml:4: 'concurrency' must be a whole number"),
        ("{concurrency: true}", "p.yaml:4: 'concurrency' must be a whole number"),
        ("{concurrency: 2.5}", "p.yaml:4: 'concurrency' must be a whole number"),
        (
            "{concurrency: 2, lease_ttl: 30}",
            "p.yaml:4: 'lease_ttl' must be a duration such as 30s or 500ms, not 30",
        ),
        (
            "{concurrency: 2, lease_ttl: soon}",
            "p.yaml:4: 'lease_ttl' must be a duration such as 30s or 500ms, not soon",
        ),
        (
            "{concurrency: 2, lease_ttl: [1s]}",
            "p.yaml:4: 'lease_ttl' must be a duration such as 30s or 500ms, not a list",
        ),
        ("{concurrency: 2, lease_ttl: 0s}", "p.yaml:4: 'lease_ttl' must be from 1ms to 1d, not 0s"),
        ("{concurrency: 2, lease_ttl: 2d}", "p.yaml:4: 'lease_ttl' must be from 1ms to 1d, not 2d"),
        (
            "{concurrency: 2, lease_ttl: " + "9" * 40 + "ms}",
            "p.yaml:4: 'lease_ttl' must be a duration such as 30s or 500ms, not " + "9" * 40 + "ms",
        ),
        (
            "{unit: minute, requests_per_unit: 5, lease_ttl: 10s}",
            "p.yaml:4: 'lease_ttl' applies only with 'concurrency' (how long a lease lasts "
            "unrenewed)",
        ),
        (
            "{unlimited: true, lease_ttl: 10s}",
            "p.yaml:4: 'lease_ttl' has no meaning when unlimited",
        ),
    ],
)
def test_bad_concurrency_fields_are_refused_naming_the_line(block: str, expected: str) -> None:
    assert problems(block) == [expected]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("requests_per_unit: 5", "requests_per_unit"),
        ("unit: minute", "unit"),
        ("algorithm: gcra", "algorithm"),
        ("burst: 3", "burst"),
        ("calendar: true", "calendar"),
        ("timezone: UTC", "timezone"),
        ("unlimited: true", "unlimited"),
        ("limits: [{unit: second, requests_per_unit: 1}]", "limits"),
    ],
)
def test_concurrency_refuses_every_rate_field(extra: str, key: str) -> None:
    assert problems(f"{{concurrency: 2, {extra}}}") == [
        f"p.yaml:4: '{key}' cannot be combined with 'concurrency' (a concurrency limit counts "
        "leases held at once, not requests per unit of time)"
    ]


def test_concurrency_keeps_name_replaces_and_rule_flags() -> None:
    text = (
        "domain: jobs\ndescriptors:\n"
        "  - key: tenant\n    shadow_mode: true\n"
        "    rate_limit: {name: jobs, concurrency: 4, replaces: [{name: other}]}\n"
        "  - key: plan\n    rate_limit: {name: other, unit: second, requests_per_unit: 1}\n"
    )
    [policy] = load_text(text, "p.yaml")
    rule = policy.descriptors[0]
    assert (rule.name, rule.replaces, rule.shadow_mode) == ("jobs", ("other",), True)
    assert load_text(dump_policy(policy), "again.yaml") == [policy]


@pytest.mark.parametrize("text", ["", "30", "1.5s", "5 years", "-1s", "ms", "1" * 400 + "s"])
def test_parse_duration_names_the_field(text: str) -> None:
    with pytest.raises(ValueError, match=r"^ttl: '.*' is not a duration such as 500ms"):
        parse_duration(text, "ttl")


@pytest.mark.parametrize("seconds", [0.001, 0.25, 1.0, 30.0, 86400.0, 1.5])
def test_format_duration_reads_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds), "x") == seconds


def test_rlconfig_lists_a_concurrency_rule() -> None:
    [policy] = load_text(rule_block("{concurrency: 3, lease_ttl: 500ms}"), "p.yaml")
    assert (
        "jobs.tenant: concurrency=3 lease_ttl=0.5s shadow_mode=false" in Snapshot([policy]).dump()
    )
